"""A task as the box reports it: over HTTP, D-Bus and the broker's `GET /task`."""

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import SkipJsonSchema

from boxd.wire.models.task_request import DroidOptions

# The worker of an owner's change (boxd/manager/owner_changes.py): no worker runs it, and
# CreateTask, which knows only droid, claude and fake, never makes one.
OWNER_WORKER = "owner"


class TaskState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"
    UNDONE = "undone"

    @property
    def ended(self) -> bool:
        return self in (TaskState.DONE, TaskState.FAILED, TaskState.UNDONE)


class Review(StrEnum):
    # Not a docstring: the OpenAPI document shows it, and boxd runs without docstrings
    # (units/python.env).
    __doc__ = (
        "Where a personal task stands with the owner: its changes wait, went into the real "
        "folders, met a file the owner changed meanwhile, or were thrown away."
    )

    PENDING = "pending"
    KEPT = "kept"
    CONFLICT = "conflict"
    UNDONE = "undone"


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    title: str
    prompt: str
    state: TaskState
    user: str
    workspace: str
    worker: str
    tools: list[str]
    hosts: list[str]
    source: str
    model: str | None = None
    budgetCents: int
    seat: str | None = None
    droid: DroidOptions | None = None
    saw: list[str] = []
    costCents: float = 0
    step: str | None = None
    error: str | None = None
    review: Review | None = None
    folder: str | None = None
    folders: list[str] | None = None
    requester: str | None = None
    app: str | None = None
    createdAt: float
    endedAt: float | None = None
    # Personal: the uid of the account that asked for the task, whose folders it works on and as
    # whom they are read and kept (manager/folders/folders.py). Kept in the record only, not shown:
    # no API answer carries it. None in a record from before boxd kept it.
    askerUid: SkipJsonSchema[int | None] = None

    def public(self) -> dict[str, Any]:
        """The fields that apply to this task: absent rather than null, as the seed shows them."""
        return self.model_dump(mode="json", exclude_none=True, exclude=_RECORD_ONLY)


_RECORD_ONLY = {"askerUid"}
