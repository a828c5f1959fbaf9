"""A step: one line of progress a worker logs through its broker.

Its own module, so the broker, which starts with every task, does not build the task models.
"""

from typing import Any

from pydantic import BaseModel, ConfigDict


class Step(BaseModel):
    """The body of the broker's `POST /step`, and the data of its `task.step` event."""

    model_config = ConfigDict(extra="forbid")

    text: str
    data: Any = None
