"""The most a task may spend before the owner is asked: its budgetCents, and at Droid's autonomy
`medium` a dollar at most. The broker holds calls to it, the manager model requests; standard
library only, as the broker imports it at start."""

from typing import Any

# Autonomy `medium` keeps the task's hosts but never lets it spend more than a dollar.
MEDIUM_BUDGET_CENTS = 100


def spending_limit(budget_cents: float, autonomy: str | None) -> float:
    if autonomy == "medium":
        return min(float(budget_cents), MEDIUM_BUDGET_CENTS)
    return float(budget_cents)


def autonomy(task: dict[str, Any]) -> str | None:
    """The autonomy of a task as `GET /task` shows it."""
    droid = task.get("droid")
    return droid.get("autonomy") if isinstance(droid, dict) else None


def budget_cents(task: dict[str, Any]) -> float:
    """The limit of a task as `GET /task` shows it."""
    return spending_limit(float(task["budgetCents"]), autonomy(task))
