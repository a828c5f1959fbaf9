"""A step: one line of progress a worker logs through its broker.

Its own module, so the broker, which starts with every task, does not build the task models.
"""

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict

from boxd import caps


class Step(BaseModel):
    """The body of the broker's `POST /step`, and the data of its `task.step` event."""

    # Built on the first step the broker (or the manager) is sent, not as the broker starts.
    model_config = ConfigDict(extra="forbid", defer_build=True)

    text: Annotated[str, caps.text("text", caps.MAX_STEP_TEXT)]
    data: Annotated[Any, caps.data("data")] = None
