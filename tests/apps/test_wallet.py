import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from boxd.apps.wallet import Balance, Pay, app, balance, pay
from boxd.sdk import Context, ToolError


def context(tmp_path: Path, key: str, task: str = "t000000001") -> Context:
    return Context(key=key, task={"id": task}, secrets={}, state_dir=tmp_path / "wallet")


def rows(tmp_path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(tmp_path / "wallet" / "ledger.db") as db:
        return db.execute("SELECT task, key, payee, cents, memo FROM bookings").fetchall()


def test_app_declares_pay_and_balance() -> None:
    tool = app.tool("pay")
    assert app.name == "wallet"
    assert tool is not None
    assert tool.cost(Pay(to="Ann", cents=250)) == 250
    assert tool.needs_ok is False
    balance_tool = app.tool("balance")
    assert balance_tool is not None
    assert balance_tool.cost(Balance()) == 0


async def test_pay_books_once_per_key(tmp_path: Path) -> None:
    first = await pay(Pay(to="Ann", cents=250, memo="lunch"), context(tmp_path, "k1"))
    again = await pay(Pay(to="Ann", cents=250, memo="lunch"), context(tmp_path, "k1"))
    assert first == again
    assert first["booking"] == "k1"
    assert (first["to"], first["cents"], first["memo"]) == ("Ann", 250, "lunch")
    assert isinstance(first["bookedAt"], int)
    assert rows(tmp_path) == [("t000000001", "k1", "Ann", 250, "lunch")]


async def test_concurrent_runs_of_one_key_book_once(tmp_path: Path) -> None:
    call = Pay(to="Bob", cents=99)
    results = await asyncio.gather(*(pay(call, context(tmp_path, "same")) for _ in range(20)))
    assert all(result == results[0] for result in results)
    assert len(rows(tmp_path)) == 1
    assert await balance(Balance(), context(tmp_path, "b")) == {"paidCents": 99, "payments": 1}


async def test_a_key_reused_for_another_payment_is_refused(tmp_path: Path) -> None:
    await pay(Pay(to="Ann", cents=250), context(tmp_path, "k1"))
    with pytest.raises(ToolError, match="already used to pay 250 cents to 'Ann'"):
        await pay(Pay(to="Ann", cents=251), context(tmp_path, "k1"))
    with pytest.raises(ToolError, match="a new payment needs a new key"):
        await pay(Pay(to="Bob", cents=250), context(tmp_path, "k1"))
    assert len(rows(tmp_path)) == 1


async def test_a_rerun_with_another_memo_returns_the_first_booking(tmp_path: Path) -> None:
    first = await pay(Pay(to="Ann", cents=250, memo="lunch"), context(tmp_path, "k1"))
    again = await pay(Pay(to="Ann", cents=250, memo="dinner"), context(tmp_path, "k1"))
    assert again == first


async def test_keys_belong_to_their_task(tmp_path: Path) -> None:
    # Keys are chosen per task (the test worker uses line numbers), so two tasks may send the
    # same key for two real payments.
    await pay(Pay(to="Ann", cents=100), context(tmp_path, "1", task="t000000001"))
    await pay(Pay(to="Bob", cents=200), context(tmp_path, "1", task="t000000002"))
    assert await balance(Balance(), context(tmp_path, "b")) == {"paidCents": 300, "payments": 2}


async def test_balance_sums_the_whole_ledger(tmp_path: Path) -> None:
    assert await balance(Balance(), context(tmp_path, "b")) == {"paidCents": 0, "payments": 0}
    for number, cents in enumerate((100, 2500, 1)):
        await pay(Pay(to="Ann", cents=cents), context(tmp_path, f"k{number}"))
    await pay(Pay(to="Ann", cents=100), context(tmp_path, "k0"))
    assert await balance(Balance(), context(tmp_path, "b")) == {"paidCents": 2601, "payments": 3}


@pytest.mark.parametrize(
    ("body", "field", "kind"),
    [
        ({"to": "Ann"}, "cents", "missing"),
        ({"to": "Ann", "cents": 0}, "cents", "greater_than_equal"),
        ({"to": "Ann", "cents": 100_001}, "cents", "less_than_equal"),
        ({"to": "Ann", "cents": "5"}, "cents", "int_type"),
        ({"to": "Ann", "cents": 5.0}, "cents", "int_type"),
        ({"to": "Ann", "cents": True}, "cents", "int_type"),
        ({"to": "", "cents": 5}, "to", "string_too_short"),
        ({"to": "x" * 201, "cents": 5}, "to", "string_too_long"),
        ({"to": "Ann", "cents": 5, "memo": "m" * 501}, "memo", "string_too_long"),
        ({"to": "Ann", "cents": 5, "tip": 1}, "tip", "extra_forbidden"),
    ],
)
def test_bad_payments_are_refused_by_the_model(body: dict[str, Any], field: str, kind: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Pay.model_validate(body)
    [error] = caught.value.errors()
    assert (error["loc"], error["type"]) == ((field,), kind)


def test_balance_takes_no_fields() -> None:
    with pytest.raises(ValidationError, match="extra"):
        Balance.model_validate({"all": True})
