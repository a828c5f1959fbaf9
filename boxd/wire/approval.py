"""Approvals: the owner's OK for a spend or a question. The id is `<task id>.<key>`, so asking
again with the same key finds the same approval, also after a restart.

A task's broker imports this with every start: the record of an approval and the owner's answer,
which only the manager and the gateway read, are boxd.wire.models.approval_record's; the manager's
question (boxd.wire.models.broker_calls.Question) is this module's checks as pydantic validators.
"""

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from boxd.errors import Problem, die
from boxd.reading.caps import MAX_LABEL, cents, text
from boxd.reading.json_reader import body

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
        die(Problem.INVALID, "a key is required")
    if not isinstance(value, str):
        die(Problem.INVALID, "key must be a string")
    if len(value) > MAX_KEY:
        die(Problem.INVALID, f"key is over {MAX_KEY} characters")
    return value


def question(value: object) -> str:
    if not isinstance(value, str):
        die(Problem.INVALID, "question: input should be a valid string")
    if not value.strip():
        die(Problem.INVALID, "question is missing")
    if len(value) > MAX_QUESTION:
        die(Problem.INVALID, f"question is over {MAX_QUESTION} characters")
    return value


payee = text("payee", MAX_LABEL)
purpose = text("purpose", MAX_LABEL)


@dataclass(frozen=True)
class AskRequest:
    """The body of the broker's `POST /ask`."""

    question: str
    key: str
    costCents: float | None = None
    payee: str | None = None
    purpose: str | None = None

    @classmethod
    def read(cls, raw: str | bytes) -> "AskRequest":
        fields = body(raw)
        ask = cls(
            fields.required("question", question),
            fields.checked_default("key", key, ""),
            fields.nullable("costCents", cents),
            fields.nullable("payee", payee),
            fields.nullable("purpose", purpose),
        )
        fields.done()
        return ask

    def json(self) -> dict[str, Any]:
        """As the manager's Ask takes it: what was not given is left out."""
        given = {
            "question": self.question,
            "key": self.key,
            "costCents": self.costCents,
            "payee": self.payee,
            "purpose": self.purpose,
        }
        return {name: value for name, value in given.items() if value is not None}


def approval_id(task_id: str, call_key: str) -> str:
    return f"{task_id}.{call_key}"
