"""What the record says a key of a task was used for: its approval and its `tool.call` line,
judged by the key rule (boxd.wire.models.key_use) against what it is wanted for now."""

from typing import Any

from boxd.errors import Problem, die
from boxd.manager.record.ledger import Ledger
from boxd.wire.approval import approval_id
from boxd.wire.models.approval_record import Approval
from boxd.wire.models.key_use import Use, approval_use, first_refusal, logged_call_use


def used(
    ledger: Ledger, task_id: str, key: str, wanted: Use
) -> tuple[Approval | None, dict[str, Any] | None]:
    """The key's approval and `tool.call` line; a 400 if they show it used for another thing
    than `wanted`."""
    approval = ledger.approval(approval_id(task_id, key))
    logged = ledger.logged_call(task_id, key)
    taken = (
        *(() if approval is None else (approval_use(approval),)),
        *(() if logged is None else (logged_call_use(logged),)),
    )
    why = first_refusal(key, taken, wanted)
    if why is not None:
        die(Problem.INVALID, why)
    return approval, logged
