"""When a call needs the owner's OK: the tool always asks, the task's autonomy says so, or the
cost would take the task's spending (calls in flight and calls waiting for an OK included) above
its budget."""

import json
from typing import Any

from boxd.wire.task_budget import autonomy, budget_cents

# The input shown in a call's question; the approval binds the whole input by its hash.
MAX_SHOWN_INPUT = 300


def shown_input(given: Any) -> str:
    """The call's input as the owner reads it in the question, cut to a readable length."""
    text = json.dumps(given, ensure_ascii=False)
    return text if len(text) <= MAX_SHOWN_INPUT else text[: MAX_SHOWN_INPUT - 1] + "…"


def why_ask(
    task: dict[str, Any],
    tool: str,
    always: bool,
    cost: float,
    spent: float,
    *,
    in_flight: float = 0,
    given: Any = None,
) -> str | None:
    """The question for the owner, or None when the call may go ahead. `in_flight` is what the
    task's other calls reserve: running, waiting for the owner, or approved and not yet run."""
    what = tool if given is None else f"{tool} {shown_input(given)}"
    spend = f"Spend {cost:g} cents on {what}?"
    if always:
        return f"{spend} {tool} always needs your OK."
    if cost > 0 and autonomy(task) == "low":
        return f"{spend} The task has low autonomy, so it asks before any spending."
    limit = budget_cents(task)
    total = spent + in_flight + cost
    if cost > 0 and total > limit:
        waiting = f" ({in_flight:g} of them for calls not yet finished)" if in_flight else ""
        return (
            f"{spend} That takes task {task['id']} to {total:g} cents{waiting}, "
            f"over its budget of {limit:g} cents."
        )
    return None
