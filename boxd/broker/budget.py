"""When a call needs the owner's OK: the tool always asks, the task's autonomy says so, or the
cost would take the task's spending (calls in flight included) above its budget."""

from typing import Any

# Autonomy `medium` keeps the task's hosts but never lets it spend more than a dollar.
MEDIUM_BUDGET_CENTS = 100


def autonomy(task: dict[str, Any]) -> str | None:
    droid = task.get("droid")
    return droid.get("autonomy") if isinstance(droid, dict) else None


def budget_cents(task: dict[str, Any]) -> float:
    budget = float(task["budgetCents"])
    if autonomy(task) == "medium":
        return min(budget, MEDIUM_BUDGET_CENTS)
    return budget


def why_ask(task: dict[str, Any], tool: str, always: bool, cost: float, spent: float) -> str | None:
    """The question for the owner, or None when the call may go ahead."""
    spend = f"Spend {cost:g} cents on {tool}?"
    if always:
        return f"{spend} {tool} always needs your OK."
    if cost > 0 and autonomy(task) == "low":
        return f"{spend} The task has low autonomy, so it asks before any spending."
    limit = budget_cents(task)
    if cost > 0 and spent + cost > limit:
        return (
            f"{spend} That takes task {task['id']} to {spent + cost:g} cents, "
            f"over its budget of {limit:g} cents."
        )
    return None
