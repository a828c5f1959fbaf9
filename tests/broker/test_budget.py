"""When the broker asks the owner before a call: budget, calls in flight, autonomy."""

from typing import Any

from boxd.broker.budget import why_ask
from boxd.wire.task_budget import budget_cents


def task(budget: int = 100, autonomy: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"id": "t000000001", "budgetCents": budget}
    if autonomy is not None:
        found["droid"] = {"autonomy": autonomy}
    return found


def test_within_budget_goes_ahead() -> None:
    assert why_ask(task(), "wallet.pay", False, 40, spent=60) is None


def test_over_budget_counts_what_is_in_flight() -> None:
    question = why_ask(task(), "wallet.pay", False, 40, spent=61)
    assert question == (
        "Spend 40 cents on wallet.pay? That takes task t000000001 to 101 cents, "
        "over its budget of 100 cents."
    )


def test_free_calls_never_ask_even_over_budget() -> None:
    assert why_ask(task(budget=0), "wallet.balance", False, 0, spent=500) is None


def test_tools_that_always_ask() -> None:
    question = why_ask(task(), "mail.send", True, 0, spent=0)
    assert question == "Spend 0 cents on mail.send? mail.send always needs your OK."


def test_autonomy() -> None:
    assert why_ask(task(autonomy="low"), "wallet.pay", False, 1, spent=0) is not None
    assert why_ask(task(autonomy="low"), "wallet.balance", False, 0, spent=0) is None
    assert budget_cents(task(budget=5000, autonomy="medium")) == 100
    assert budget_cents(task(budget=50, autonomy="medium")) == 50
    assert why_ask(task(budget=5000, autonomy="medium"), "wallet.pay", False, 101, 0) is not None
    assert budget_cents(task(budget=5000, autonomy="high")) == 5000
    assert why_ask(task(budget=5000, autonomy="high"), "wallet.pay", False, 4000, 0) is None


def test_calls_not_yet_finished_count_and_are_named() -> None:
    assert why_ask(task(), "wallet.pay", False, 10, spent=0, in_flight=90) is None
    question = why_ask(task(), "wallet.pay", False, 10, spent=5, in_flight=300)
    assert question == (
        "Spend 10 cents on wallet.pay? That takes task t000000001 to 315 cents (300 of them for "
        "calls not yet finished), over its budget of 100 cents."
    )


def test_the_question_shows_the_input_it_approves() -> None:
    question = why_ask(task(), "wallet.pay", True, 5, 0, given={"to": "Ada", "cents": 5})
    assert question == (
        'Spend 5 cents on wallet.pay {"to": "Ada", "cents": 5}? wallet.pay always needs your OK.'
    )
    long = why_ask(task(), "mail.send", True, 0, 0, given={"body": "x" * 5000})
    assert long is not None
    shown = long.removeprefix("Spend 0 cents on mail.send ").split("?")[0]
    assert len(shown) == 300 and shown.endswith("…")
