"""The manager's side of keys and approvals, on a real SQLite record: a key names one call or
one question, and the costs of calls waiting for the owner stay reserved, also after a restart.
D-Bus is a stand-in here (nothing listens); tests/vm has the real bus."""

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from boxd.errors import BoxError
from boxd.manager.approval_answers import ApprovalAnswers
from boxd.manager.broker_methods import BrokerMethods
from boxd.wire.approval import ApprovalState
from boxd.wire.event import EventKind
from boxd.wire.models.key_use import input_hash
from tests.support.broker_methods import BROKER, OWNER, TASK, open_methods, pay


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[tuple[BrokerMethods, ApprovalAnswers]]:
    methods, answers, store = await open_methods(tmp_path / "box.db")
    yield methods, answers
    await store.close()


def okay_for(key: str, cents: int) -> str:
    question = {"key": key, "question": "Spend?", "costCents": cents, "tool": "wallet.pay"}
    return json.dumps(question)


async def refused(call: Any, message: str) -> None:
    with pytest.raises(BoxError) as caught:
        await call
    assert caught.value.message == message


async def test_an_answered_question_is_no_calls_approval(
    box: tuple[BrokerMethods, ApprovalAnswers],
) -> None:
    methods, answers = box
    asked = await methods.ask(BROKER, TASK, json.dumps({"key": "k", "question": "News?"}))
    assert "tool" not in asked and "inputHash" not in asked
    await answers.answer_approval(OWNER, asked["id"], True)
    await refused(
        methods.begin_call(BROKER, TASK, pay("Mallory", 100_000, "k")),
        "key k was used for a question (POST /ask); a call needs a key of its own",
    )
    await refused(
        methods.ask(BROKER, TASK, okay_for("k", 100_000)),
        "key k was used for a question (POST /ask); a call needs a key of its own",
    )
    await refused(
        methods.ask(BROKER, TASK, json.dumps({"key": "k", "question": "Pay Mallory?"})),
        "key k was used for another question; a new question needs a new key",
    )
    again = await methods.ask(BROKER, TASK, json.dumps({"key": "k", "question": "News?"}))
    assert again["state"] == ApprovalState.APPROVED
    events = await methods.records.store.events(TASK, EventKind.TOOL_CALL)
    assert events == []


async def test_a_call_approval_records_its_call(
    box: tuple[BrokerMethods, ApprovalAnswers],
) -> None:
    methods, _ = box
    begun = await methods.begin_call(BROKER, TASK, pay("Ada", 500, "k"))
    assert begun == {"answered": None, "spentCents": 0, "reservedCents": {}, "approval": None}
    (line,) = await methods.records.store.events(TASK, EventKind.TOOL_CALL)
    assert line.data["inputHash"] == input_hash({"to": "Ada", "cents": 500})
    assert line.data["costCents"] == 500
    approval = await methods.ask(BROKER, TASK, okay_for("k", 500))
    assert (approval["tool"], approval["costCents"]) == ("wallet.pay", 500)
    assert approval["inputHash"] == line.data["inputHash"]
    again = await methods.begin_call(BROKER, TASK, pay("Ada", 500, "k"))
    assert again["approval"] == approval
    other_input = (
        "key k was used for a call of wallet.pay with another input; a new call needs a new key"
    )
    await refused(methods.begin_call(BROKER, TASK, pay("Mallory", 500, "k")), other_input)
    await refused(
        methods.ask(BROKER, TASK, okay_for("k", 5)),
        "key k was used for a call of wallet.pay costing 500 cents, not 5; "
        "a new call needs a new key",
    )
    await refused(
        methods.ask(BROKER, TASK, json.dumps({"key": "k", "question": "Pay?"})),
        "key k was used for a call of wallet.pay; a question needs a key of its own",
    )
    await refused(
        methods.ask(BROKER, TASK, okay_for("never-begun", 5)),
        "key never-begun began no call to approve",
    )
    # Still one tool.call line for k.
    assert len(await methods.records.store.events(TASK, EventKind.TOOL_CALL)) == 1


async def test_an_answered_call_key_returns_its_result_only_for_its_call(
    box: tuple[BrokerMethods, ApprovalAnswers],
) -> None:
    methods, _ = box
    say = {"key": "e", "tool": "echo.say", "input": {"text": "a"}, "costCents": 0}
    await methods.begin_call(BROKER, TASK, json.dumps(say))
    finished = {"key": "e", "tool": "echo.say", "ok": True, "output": {"text": "a"}}
    await methods.finish_call(BROKER, TASK, json.dumps(finished))
    again = await methods.begin_call(BROKER, TASK, json.dumps(say))
    assert again["answered"] == {"ok": True, "output": {"text": "a"}}
    await refused(
        methods.begin_call(BROKER, TASK, json.dumps({**say, "input": {"text": "b"}})),
        "key e was used for a call of echo.say with another input; a new call needs a new key",
    )


async def test_waiting_calls_stay_reserved_across_a_restart(tmp_path: Path) -> None:
    methods, answers, store = await open_methods(tmp_path / "box.db")
    for key, to in (("a", "Ada"), ("b", "Bob")):
        await methods.begin_call(BROKER, TASK, pay(to, 150, key))
        await methods.ask(BROKER, TASK, okay_for(key, 150))
    third = await methods.begin_call(BROKER, TASK, pay("Cy", 10, "c"))
    assert third["reservedCents"] == {"a": 150, "b": 150}
    # The same call as a under another key would share a's run: not counted twice.
    same = await methods.begin_call(BROKER, TASK, pay("Ada", 150, "a2"))
    assert same["reservedCents"] == {"b": 150}
    await store.close()

    methods, answers, store = await open_methods(tmp_path / "box.db")
    assert (await methods.begin_call(BROKER, TASK, pay("Cy", 10, "c")))["reservedCents"] == {
        "a": 150,
        "b": 150,
    }
    await answers.answer_approval(OWNER, f"{TASK}.a", False)
    await answers.answer_approval(OWNER, f"{TASK}.b", True)
    # b is approved and not yet run: still reserved; a was denied: not.
    assert (await methods.begin_call(BROKER, TASK, pay("Cy", 10, "c")))["reservedCents"] == {
        "b": 150
    }
    done = {"key": "b", "tool": "wallet.pay", "ok": True, "output": {}, "costCents": 150}
    finished = await methods.finish_call(BROKER, TASK, json.dumps(done))
    assert finished["spentCents"] == 150
    last = await methods.begin_call(BROKER, TASK, pay("Cy", 10, "c"))
    assert (last["reservedCents"], last["spentCents"]) == ({}, 150)
    await store.close()


def shares(to: str, cents: int, key: str, first: str) -> str:
    return json.dumps({**json.loads(pay(to, cents, key)), "sharesWith": first})


async def test_a_key_that_shares_a_run_is_answered_with_it_even_if_its_broker_dies(
    tmp_path: Path,
) -> None:
    """k2 came while k1 ran and shares its run. The broker is killed after k1's FinishCall,
    before k2's: k2 asked again must get k1's result, never run Ada's payment a second time."""
    methods, _, store = await open_methods(tmp_path / "box.db")
    await methods.begin_call(BROKER, TASK, pay("Ada", 30, "k1"))
    await methods.begin_call(BROKER, TASK, shares("Ada", 30, "k2", "k1"))
    done = {"key": "k1", "tool": "wallet.pay", "ok": True, "output": {"paid": 30}, "costCents": 30}
    await methods.finish_call(BROKER, TASK, json.dumps(done))
    await store.close()
    # A new manager, as after the crash: k2 is answered, and paid once.
    methods, _, store = await open_methods(tmp_path / "box.db")
    again = await methods.begin_call(BROKER, TASK, pay("Ada", 30, "k2"))
    assert again["answered"] == {"ok": True, "output": {"paid": 30}}
    assert again["spentCents"] == 30
    # The FinishCall the broker would have sent for k2 changes nothing.
    shared = {**done, "key": "k2", "costCents": 0, "sharedWith": "k1"}
    assert (await methods.finish_call(BROKER, TASK, json.dumps(shared)))["spentCents"] == 30
    results = [e.data for e in await store.events(TASK) if e.kind == EventKind.TOOL_RESULT]
    assert [(r["key"], r.get("sharedWith"), r["costCents"]) for r in results] == [
        ("k1", None, 30),
        ("k2", "k1", 0),
    ]
    await store.close()


async def test_a_call_cannot_claim_to_share_another_call_s_run(
    box: tuple[BrokerMethods, ApprovalAnswers],
) -> None:
    methods, _ = box
    await methods.begin_call(BROKER, TASK, pay("Ada", 30, "k1"))
    await refused(
        methods.begin_call(BROKER, TASK, shares("Bob", 30, "k2", "k1")),
        "the call k1 is not this call: another tool or input",
    )
    # One whose first call was never begun (refused meanwhile) runs on its own.
    begun = await methods.begin_call(BROKER, TASK, shares("Ada", 30, "k3", "nothing"))
    assert begun["answered"] is None
