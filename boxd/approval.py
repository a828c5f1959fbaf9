"""Approvals: the owner's OK for a spend or a question. The id is `<task id>.<key>`, so asking
again with the same key finds the same approval, also after a restart."""

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, StrictBool, StrictStr, field_validator

from boxd.caps import MAX_LABEL, cents, text
from boxd.plain_errors import plain

MAX_KEY = 200
MAX_QUESTION = 2000
TASK_ENDED = "task ended"


class ApprovalState(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"


def key(value: object) -> str:
    """Keys make calls idempotent: every /call and /ask needs one."""
    if value is None or value == "":
        raise plain("a key is required")
    if not isinstance(value, str):
        raise plain("key must be a string")
    if len(value) > MAX_KEY:
        raise plain(f"key is over {MAX_KEY} characters")
    return value


Key = Annotated[str, BeforeValidator(key)]


class AskRequest(BaseModel):
    """The body of the broker's `POST /ask`."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    question: StrictStr
    key: Key = ""
    costCents: Annotated[float, BeforeValidator(cents)] | None = None
    payee: Annotated[str, text("payee", MAX_LABEL)] | None = None
    purpose: Annotated[str, text("purpose", MAX_LABEL)] | None = None

    @field_validator("question")
    @classmethod
    def _question(cls, value: str) -> str:
        if not value.strip():
            raise plain("question is missing")
        if len(value) > MAX_QUESTION:
            raise plain(f"question is over {MAX_QUESTION} characters")
        return value


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
    # For a call: its tool, the sha256 of its validated input (boxd.key_use) and costCents, so
    # the owner's yes approves that call and no other.
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
    """The owner's answer: `{"approved": true}` or `{"approved": false}`."""

    model_config = ConfigDict(extra="forbid")

    approved: StrictBool


def approval_id(task_id: str, call_key: str) -> str:
    return f"{task_id}.{call_key}"
