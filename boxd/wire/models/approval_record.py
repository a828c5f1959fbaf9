"""An approval as the box records and shows it, and the owner's answer to one.

The manager's and the gateway's models, kept apart from boxd.wire.approval: a task's broker, which
starts with every task, needs only the question's model and the states, and does not build these.
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, StrictBool

from boxd.wire.approval import ApprovalState


class Approval(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    task: str
    key: str
    state: ApprovalState
    question: str
    costCents: float | None = None
    payee: str | None = None
    purpose: str | None = None
    # For a call: its tool, the sha256 of its validated input (boxd.wire.models.key_use) and
    # costCents, so the owner's yes approves that call and no other.
    tool: str | None = None
    inputHash: str | None = None
    # For a model request the gateway holds until the owner answers: the model it runs on, with
    # the sha256 of the request's body in inputHash.
    model: str | None = None
    askedAt: float
    answeredAt: float | None = None
    answeredBy: str | None = None

    def public(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class Answer(BaseModel):
    # Not a docstring: the OpenAPI document shows it, and boxd runs without docstrings
    # (units/python.env).
    __doc__ = 'The owner\'s answer: `{"approved": true}` or `{"approved": false}`.'

    model_config = ConfigDict(extra="forbid")

    approved: StrictBool
