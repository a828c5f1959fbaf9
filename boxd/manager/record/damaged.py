"""What boxd makes of a task whose record in box.db cannot be read (written by hand, by an older
boxd, or a disk that lost it): the task, failed, saying so, with whatever of it can be trusted.
One such row never stops the manager, nor any list."""

import json
import logging
import math
import time
from typing import Any

from boxd.manager.workspaces.workspaces import NAME
from boxd.wire.ids import task_user
from boxd.wire.models.task import Task, TaskState
from boxd.wire.models.task_request import MAX_TITLE

log = logging.getLogger(__name__)

DAMAGED = (
    "The record of this task in box.db was damaged and could not be read, so boxd "
    "stopped it and marked it failed."
)
DAMAGED_TITLE = "(a task whose record was damaged)"
# What a step whose record cannot be read shows.
DAMAGED_STEP = {"text": "(this step's record in box.db was damaged and could not be read)"}


def _text(old: dict[str, Any], name: str, limit: int) -> str | None:
    value = old.get(name)
    return value if isinstance(value, str) and 0 < len(value) <= limit else None


def salvage(task_id: str, created: Any, record: Any, why: Exception) -> Task:
    """The task failed, keeping of its record only what reads as it should."""
    log.error("the record of task %s in box.db is damaged: %s", task_id, " ".join(str(why).split()))
    try:
        old = json.loads(record)
    except (ValueError, TypeError):
        old = None
    if not isinstance(old, dict):
        old = {}
    workspace = _text(old, "workspace", 100)
    cost = old.get("costCents")
    at = created if isinstance(created, int | float) and math.isfinite(created) else time.time()
    return Task(
        id=task_id,
        title=_text(old, "title", MAX_TITLE) or DAMAGED_TITLE,
        prompt="",
        state=TaskState.FAILED,
        user=task_user(task_id),
        workspace=workspace if workspace is not None and NAME.fullmatch(workspace) else "home",
        worker=_text(old, "worker", 20) or "fake",
        tools=[],
        hosts=[],
        source="api",
        budgetCents=0,
        costCents=cost if isinstance(cost, int | float) and math.isfinite(cost) else 0,
        error=DAMAGED,
        createdAt=float(at),
    )
