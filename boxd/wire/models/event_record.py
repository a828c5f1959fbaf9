"""A log event as the store keeps it and the task object's Event signal carries it.

The manager's model, kept apart from boxd.wire.event, whose kinds a task's broker needs (it waits
for approval events) without building this.
"""

from typing import Any

from pydantic import BaseModel, ConfigDict


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int
    task: str
    kind: str
    at: float
    data: dict[str, Any]
