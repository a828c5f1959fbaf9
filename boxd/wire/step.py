"""A step: one line of progress a worker logs through its broker.

Its own module, so the broker, which starts with every task, does not build the task models.
"""

from dataclasses import dataclass
from typing import Any

from boxd.reading import caps
from boxd.reading.json_reader import body


@dataclass(frozen=True)
class Step:
    """The body of the broker's `POST /step`, and the data of its `task.step` event."""

    text: str
    data: Any = None

    @classmethod
    def read(cls, raw: str | bytes) -> "Step":
        """Read by the broker from its worker, and by the manager from the broker."""
        fields = body(raw)
        step = cls(
            fields.required("text", caps.text("text", caps.MAX_STEP_TEXT)),
            fields.optional("data", caps.data("data"), None),
        )
        fields.done()
        return step

    def json(self) -> dict[str, Any]:
        return {"text": self.text, "data": self.data}
