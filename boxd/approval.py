"""Approvals: the owner's OK for a spend or a question. The id is `<task id>.<key>`, so asking
again with the same key finds the same approval, also after a restart.

A task's broker imports this with every start: the record of an approval and the owner's answer,
which only the manager and the gateway read, are boxd.approval_record's.
"""

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, StrictStr, field_validator

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

    # Built on its first /ask, which many tasks never send, rather than at the broker's start.
    model_config = ConfigDict(extra="forbid", validate_default=True, defer_build=True)

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


def approval_id(task_id: str, call_key: str) -> str:
    return f"{task_id}.{call_key}"
