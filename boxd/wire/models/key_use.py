"""What a key was used for: one call (its tool, the hash of its validated input, its cost), one
question, or one model request (the hash of its body, as the task's model gateway got it). A key
names one thing for good, so an owner's yes to one thing never stands for another: the same key
for anything else is refused in plain words, before anything runs.

The manager judges with this, from the record: the `tool.call` line a call's key logged and the
approval a key asked for.
"""

from dataclasses import dataclass
from typing import Any

# Named here too, where the broker has always found it.
from boxd.reading.canonical_json import input_hash as input_hash
from boxd.wire.models.approval_record import Approval


@dataclass(frozen=True)
class CallUse:
    tool: str
    # None where an older boxd recorded the use without it: then it is not compared.
    inputHash: str | None
    costCents: float | None


@dataclass(frozen=True)
class QuestionUse:
    question: str
    costCents: float | None = None
    payee: str | None = None
    purpose: str | None = None


@dataclass(frozen=True)
class ModelUse:
    """A model request the gateway asked the owner about: its key is `model.<requestHash>`."""

    requestHash: str


Use = CallUse | QuestionUse | ModelUse

# What each kind of use is called in a refusal.
_CALLED = {CallUse: "a call", QuestionUse: "a question", ModelUse: "a model request"}


def logged_call_use(data: dict[str, Any]) -> CallUse:
    """The use a `tool.call` line records (older lines have no hash or cost: the hash is made
    from the input they logged)."""
    cost = data.get("costCents")
    return CallUse(
        tool=str(data.get("tool")),
        inputHash=str(data.get("inputHash") or input_hash(data.get("input"))),
        costCents=None if cost is None else float(cost),
    )


def approval_use(approval: Approval) -> Use:
    if approval.model is not None:
        return ModelUse(str(approval.inputHash))
    if approval.tool is None:
        return QuestionUse(approval.question, approval.costCents, approval.payee, approval.purpose)
    return CallUse(approval.tool, approval.inputHash, approval.costCents)


def _differ(taken: object, wanted: object) -> bool:
    """Both recorded, and not the same."""
    return taken is not None and wanted is not None and taken != wanted


def _taken_for(key: str, taken: Use) -> str:
    if isinstance(taken, QuestionUse):
        return f"key {key} was used for a question (POST /ask)"
    if isinstance(taken, CallUse):
        return f"key {key} was used for a call of {taken.tool}"
    return f"key {key} was used for a model request"


def refusal(key: str, taken: Use, wanted: Use) -> str | None:
    """Why `key`, already used for `taken`, may not be used for `wanted`; None if they are one."""
    if type(taken) is not type(wanted):
        return f"{_taken_for(key, taken)}; {_CALLED[type(wanted)]} needs a key of its own"
    if isinstance(wanted, CallUse) and isinstance(taken, CallUse):
        if taken.tool != wanted.tool:
            return f"key {key} was used for a call of {taken.tool}; a new call needs a new key"
        if _differ(taken.inputHash, wanted.inputHash):
            return (
                f"key {key} was used for a call of {taken.tool} with another input; "
                "a new call needs a new key"
            )
        if _differ(taken.costCents, wanted.costCents):
            return (
                f"key {key} was used for a call of {taken.tool} costing "
                f"{taken.costCents:g} cents, not {wanted.costCents:g}; "
                "a new call needs a new key"
            )
        return None
    if taken == wanted:
        return None
    if isinstance(wanted, ModelUse):
        return f"key {key} was used for another model request; a new request needs a new key"
    return f"key {key} was used for another question; a new question needs a new key"


def first_refusal(key: str, taken: tuple[Use, ...], wanted: Use) -> str | None:
    for use in taken:
        why = refusal(key, use, wanted)
        if why is not None:
            return why
    return None
