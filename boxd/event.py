"""Log events: the durable story of a task, in SQLite and, for reading, in the journal."""

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict


class EventKind(StrEnum):
    TASK_STATE = "task.state"
    TASK_STEP = "task.step"
    TOOL_CALL = "tool.call"
    TOOL_RESULT = "tool.result"
    COST = "cost"
    APPROVAL = "approval"
    NET_REFUSED = "net.refused"


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int
    task: str
    kind: str
    at: float
    data: dict[str, Any]
