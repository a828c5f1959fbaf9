"""The manager's side of model requests (boxd.manager.model_requests) on a real SQLite record:
what is reserved before a request goes, when the owner is asked, what one yes lets through, what
each reply is charged, and what a broker that vanished mid-request is charged. D-Bus is a
stand-in here (nothing listens); tests/vm/test_model_money.py has the real bus and broker."""

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from dbus_fast.aio import MessageBus

from boxd.errors import BoxError
from boxd.manager.approval_answers import ApprovalAnswers
from boxd.manager.broker_methods import BrokerMethods
from boxd.manager.model_requests import ModelRequests, approval_key
from boxd.manager.record.ledger import TaskSave
from boxd.manager.record.records import Records
from boxd.manager.record.store import Store
from boxd.wire.approval import ApprovalState
from boxd.wire.caller import Caller, Role
from boxd.wire.event import EventKind
from boxd.wire.models.settings import Settings
from boxd.wire.models.task import TaskState
from boxd.wire.models.task_request import Autonomy, DroidOptions
from boxd.wire.pricing import Tokens, price_cents, reservation_cents
from tests.support.broker_methods import QuietBus, pay
from tests.support.presence import BROKER, LATER_BROKER, TASK, Presence
from tests.support.tasks import a_task

MODEL = "claude-sonnet-4-6"
OWNER = Caller(Role.OWNER, "owner")
BODY = "a" * 64
OTHER = "b" * 64
# 40 KB of Droid's first turn, estimated at a token a 3 bytes, and Droid's max_tokens.
INPUT, OUTPUT = 13_654, 32_000
USAGE = Tokens(input=1200, output=345, cacheWrite=2000, cacheRead=48000)


@dataclass
class Box:
    store: Store
    records: Records
    models: ModelRequests
    calls: BrokerMethods
    answers: ApprovalAnswers
    presence: Presence

    async def task(self) -> dict[str, Any]:
        return (await self.records.task(TASK)).public()

    async def set_task(self, **update: Any) -> None:
        task = (await self.records.task(TASK)).model_copy(update=update)
        await self.records.record(TaskSave(task, EventKind.TASK_STATE, {"state": task.state.value}))

    async def costs(self) -> list[dict[str, Any]]:
        return [event.data for event in await self.store.events(TASK, EventKind.COST)]

    async def open(self) -> list[tuple[str, str, dict[str, Any]]]:
        return await self.store.model_requests(TASK)


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[Box]:
    store = Store(tmp_path / "box.db")
    await store.open()
    records = Records(store, cast(MessageBus, QuietBus()))
    task = a_task().model_copy(update={"state": TaskState.RUNNING, "model": MODEL})
    records.export(task)
    await records.record(TaskSave(task, EventKind.TASK_STATE, {"state": "running"}))
    presence = Presence()
    yield Box(
        store,
        records,
        ModelRequests(records, presence),
        BrokerMethods(records),
        ApprovalAnswers(records),
        presence,
    )
    await store.close()


def start(
    request: str = "0" * 16,
    digest: str = BODY,
    *,
    input_tokens: int = INPUT,
    max_tokens: int = OUTPUT,
    hour_cache: bool = False,
    in_flight: float = 0,
) -> str:
    return json.dumps(
        {
            "request": request,
            "requestHash": digest,
            "inputTokens": input_tokens,
            "maxTokens": max_tokens,
            "hourCache": hour_cache,
            "inFlight": {"line-9": in_flight} if in_flight else {},
        }
    )


def part(request: str, which: str, tokens: Tokens, **more: Any) -> str:
    counts = {k: v for k, v in tokens.json().items() if v}
    return json.dumps({"request": request, "part": which, "tokens": counts, **more})


def worst(input_tokens: int = INPUT, max_tokens: int = OUTPUT, hour: bool = False) -> float:
    return sum(reservation_cents(MODEL, input_tokens, max_tokens, hour))


async def test_a_request_within_budget_reserves_its_worst_case_until_its_reply_ends(
    box: Box,
) -> None:
    begun = await box.models.begin(BROKER, TASK, start("1" * 16))
    assert begun == {"admitted": True, "upstream": "https://api.anthropic.com"}
    ((request, holder, record),) = await box.open()
    assert (request, holder) == ("1" * 16, f"bus/{BROKER.name}")
    # 13,654 input tokens at the 5-minute cache write's $3.75 a million; 32,000 at $15.
    assert (record["inputCents"], record["outputCents"]) == pytest.approx((5.12025, 48.0))
    # The calls see it reserved, as they see each other.
    call = await box.calls.begin_call(BROKER, TASK, pay("Ada", 5, "k"))
    assert call["reservedCents"] == {f"model request {'1' * 16}": pytest.approx(worst())}

    started = Tokens(input=1200, output=1, cacheWrite=2000, cacheRead=48000)
    await box.models.log_cost(BROKER, TASK, part("1" * 16, "start", started))
    # Its input is charged as it really was: only its output stays reserved.
    call = await box.calls.begin_call(BROKER, TASK, pay("Ada", 5, "k2"))
    assert call["reservedCents"] == {f"model request {'1' * 16}": pytest.approx(48.0 - 0.0015)}
    rest = Tokens(input=0, output=344)
    # The end says all the reply said; the manager charges what grew.
    await box.models.log_cost(BROKER, TASK, part("1" * 16, "end", USAGE, status=200, complete=True))
    assert await box.open() == []
    costs = await box.costs()
    assert [cost["cents"] for cost in costs] == [
        pytest.approx(price_cents(MODEL, started)),
        pytest.approx(price_cents(MODEL, rest)),
    ]
    assert (await box.task())["costCents"] == pytest.approx(price_cents(MODEL, USAGE))


async def test_a_reply_that_never_says_its_final_usage_is_charged_its_reservation(
    box: Box,
) -> None:
    """The attacker's stream closed before message_delta: today's charge would be its input
    and one output token; the box charges the most its output could have been."""
    started = Tokens(input=1200, output=1)
    await box.models.begin(BROKER, TASK, start("1" * 16))
    await box.models.log_cost(BROKER, TASK, part("1" * 16, "start", started))
    await box.models.log_cost(BROKER, TASK, part("1" * 16, "end", Tokens(0, 0), status=200))
    first, second = await box.costs()
    assert first["cents"] == pytest.approx(price_cents(MODEL, started))
    # The most its output could have been (32,000 tokens), less the one token charged.
    assert (second["cents"], second["reserved"]) == (pytest.approx(48.0 - 0.0015), True)
    # A whole reply that said nothing (no usage at all) is charged all of its reservation.
    await box.set_task(budgetCents=1000)
    await box.models.begin(BROKER, TASK, start("2" * 16, OTHER))
    await box.models.log_cost(BROKER, TASK, part("2" * 16, "end", Tokens(0, 0), status=200))
    assert (await box.costs())[-1]["cents"] == pytest.approx(worst())


async def test_an_error_reply_is_not_charged_and_closes_the_request(box: Box) -> None:
    await box.models.begin(BROKER, TASK, start("1" * 16))
    await box.models.log_cost(BROKER, TASK, part("1" * 16, "end", Tokens(0, 0), status=529))
    assert await box.open() == []
    assert await box.costs() == []


async def test_each_part_counts_once_however_often_it_is_sent(box: Box) -> None:
    """The broker's link sends a call again when the manager's answer never came (it died after
    the commit): a start or an end logged twice would charge twice."""
    started = Tokens(input=1200, output=1)
    await box.models.begin(BROKER, TASK, start("1" * 16))
    await box.models.begin(BROKER, TASK, start("1" * 16))
    assert len(await box.open()) == 1
    for _ in range(2):
        await box.models.log_cost(BROKER, TASK, part("1" * 16, "start", started))
    end = part("1" * 16, "end", Tokens(input=0, output=9), status=200, complete=True)
    assert await box.models.log_cost(BROKER, TASK, end) == {"logged": True}
    assert await box.models.log_cost(BROKER, TASK, end) == {"logged": False}
    assert len(await box.costs()) == 2


async def test_requests_in_flight_are_counted_before_the_next_goes(box: Box) -> None:
    """Today eight requests at once were never asked about: each saw only what was spent.
    Now the second finds the first's worst case reserved and asks; so do calls in flight."""
    await box.set_task(budgetCents=100)
    assert (await box.models.begin(BROKER, TASK, start("1" * 16)))["admitted"]
    second = await box.models.begin(BROKER, TASK, start("2" * 16, OTHER))
    approval = second["approval"]
    assert (approval["key"], approval["state"]) == (f"model.{OTHER}", "pending")
    assert approval["question"] == (
        f"Let task {TASK} ask its model ({MODEL}) once more? It has spent 0 cents, with 53.13 "
        "cents more held for requests and calls not yet finished; this request may cost up to "
        "53.13 cents, which would take it past its budget of 100 cents."
    )
    assert approval["costCents"] == pytest.approx(worst())
    assert (await box.task())["state"] == "waiting"
    # What the broker's own calls in flight hold counts too.
    await box.models.log_cost(BROKER, TASK, part("1" * 16, "end", Tokens(0, 0), status=529))
    third = await box.models.begin(BROKER, TASK, start("3" * 16, "c" * 64, in_flight=50))
    assert "approval" in third


async def test_one_yes_lets_one_request_through(box: Box) -> None:
    """Today the owner's yes was keyed on the body's hash and never spent: every later request
    with the same bytes went without asking. Now it is spent once answered 200."""
    await box.set_task(costCents=99.0)
    asked = (await box.models.begin(BROKER, TASK, start("1" * 16)))["approval"]
    # Droid's retry while the owner has not answered finds the same approval.
    again = await box.models.begin(BROKER, TASK, start("2" * 16))
    assert again["approval"] == asked
    await box.answers.answer_approval(OWNER, asked["id"], True)
    assert (await box.models.begin(BROKER, TASK, start("3" * 16)))["admitted"]
    # The same bytes again while the first is in flight: that yes is taken.
    assert (await box.models.begin(BROKER, TASK, start("4" * 16)))["taken"]
    # Answered with an error, the approval is free again for Droid's retry.
    await box.models.log_cost(BROKER, TASK, part("3" * 16, "end", Tokens(0, 0), status=529))
    assert (await box.models.begin(BROKER, TASK, start("5" * 16)))["admitted"]
    done = part("5" * 16, "end", Tokens(input=10, output=10), status=200, complete=True)
    await box.models.log_cost(BROKER, TASK, done)
    # Spent: the same bytes again ask anew, under a key of their own.
    fresh = (await box.models.begin(BROKER, TASK, start("6" * 16)))["approval"]
    assert fresh["key"] == approval_key(BODY, 2) == f"model.{BODY}.2"
    assert fresh["state"] == "pending"
    await box.answers.answer_approval(OWNER, fresh["id"], False)
    denied = await box.models.begin(BROKER, TASK, start("7" * 16))
    assert denied["approval"]["state"] == ApprovalState.DENIED


async def test_a_request_that_asked_waits_for_its_answer_even_if_it_fits_now(box: Box) -> None:
    await box.set_task(costCents=99.0)
    asked = (await box.models.begin(BROKER, TASK, start("1" * 16)))["approval"]
    await box.set_task(costCents=0.0)
    assert (await box.models.begin(BROKER, TASK, start("2" * 16)))["approval"] == asked


async def test_medium_autonomy_holds_the_budget_to_a_dollar(box: Box) -> None:
    await box.set_task(
        budgetCents=5000, droid=DroidOptions(autonomy=Autonomy.MEDIUM), costCents=50.0
    )
    answer = await box.models.begin(BROKER, TASK, start())
    assert "its budget of 100 cents" in answer["approval"]["question"]


async def test_max_tokens_over_the_boxs_cap_is_refused_in_words(box: Box) -> None:
    await box.store.save_settings(Settings(modelMaxTokens=8000))
    with pytest.raises(BoxError) as refused:
        await box.models.begin(BROKER, TASK, start(max_tokens=8001))
    assert refused.value.message.startswith(
        "max_tokens is 8,001, over this box's cap of 8,000 output tokens a model request "
        "(Settings modelMaxTokens)"
    )
    assert await box.open() == []


async def test_the_workers_keys_never_stand_for_a_model_request(box: Box) -> None:
    """The attacker: a worker that asks under the key the gateway would use (it can hash its
    own body) gets no model request approved by that yes; the request is refused instead."""
    lure = json.dumps({"key": f"model.{BODY}", "question": "Let the model answer once more?"})
    asked = await box.calls.ask(BROKER, TASK, lure)
    await box.answers.answer_approval(OWNER, asked["id"], True)
    await box.set_task(costCents=99.0)
    with pytest.raises(BoxError) as refused:
        await box.models.begin(BROKER, TASK, start())
    assert refused.value.message == (
        f"key model.{BODY} was used for a question (POST /ask); a model request needs a key "
        "of its own"
    )


async def test_late_costs_are_recorded_after_the_task_ended(box: Box) -> None:
    """Today LogCost refused a cost once the task had ended, and the reply went uncharged."""
    await box.models.begin(BROKER, TASK, start("1" * 16))
    await box.set_task(state=TaskState.DONE)
    end = part("1" * 16, "end", Tokens(input=100, output=10), status=200, complete=True)
    await box.models.log_cost(BROKER, TASK, end)
    assert (await box.task())["costCents"] == pytest.approx(
        price_cents(MODEL, Tokens(input=100, output=10))
    )
    with pytest.raises(BoxError):
        await box.models.begin(BROKER, TASK, start("2" * 16))


async def test_a_request_whose_broker_is_gone_is_charged_what_it_reserved(box: Box) -> None:
    """A broker killed mid-reply says no more: its request is charged what it still reserves
    (after message_start, the output), and a yes it went under is spent."""
    await box.set_task(costCents=99.0)
    asked = (await box.models.begin(BROKER, TASK, start("1" * 16)))["approval"]
    await box.answers.answer_approval(OWNER, asked["id"], True)
    await box.models.begin(BROKER, TASK, start("1" * 16))
    started = Tokens(input=1200, output=1)
    await box.models.log_cost(BROKER, TASK, part("1" * 16, "start", started))
    box.presence.live.discard(BROKER.name)
    # The broker started again begins a request: the one it left is settled first.
    await box.models.begin(LATER_BROKER, TASK, start("2" * 16, OTHER))
    left = [r for r in await box.open() if r[0] == "1" * 16]
    assert left == []
    *_, charged = await box.costs()
    assert (charged["cents"], charged["reserved"]) == (pytest.approx(48.0 - 0.0015), True)
    # Its yes is spent: the same bytes ask again.
    assert "approval" in await box.models.begin(LATER_BROKER, TASK, start("3" * 16))


async def test_what_a_broker_left_open_is_settled_when_boxd_starts(box: Box) -> None:
    await box.set_task(budgetCents=1000)
    await box.models.begin(BROKER, TASK, start("1" * 16))
    box.presence.live.clear()
    await box.models.settle_all_gone()
    assert await box.open() == []
    ((cost),) = await box.costs()
    assert cost["cents"] == pytest.approx(worst())
    # A broker still there keeps its requests.
    box.presence.live.add(BROKER.name)
    await box.models.begin(BROKER, TASK, start("2" * 16))
    await box.models.settle_all_gone()
    assert len(await box.open()) == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"request": "x"},
        {"request": "0" * 17},
        {"inputTokens": -1},
        {"inputTokens": 1.5},
        {"maxTokens": 0},
        {"maxTokens": True},
        {"inFlight": {"k": float("inf")}},
        {"inFlight": {"k": -1}},
        {"inFlight": {"": 1}},
        {"inFlight": {str(n): 1 for n in range(1025)}},
        {"requestHash": "A" * 64},
        {"extra": 1},
    ],
)
async def test_a_malformed_start_is_refused(box: Box, bad: dict[str, Any]) -> None:
    given = {**json.loads(start()), **bad}
    with pytest.raises(BoxError):
        await box.models.begin(BROKER, TASK, json.dumps(given))
    assert await box.open() == []


@pytest.mark.parametrize(
    "bad",
    [
        {"part": "middle"},
        {"tokens": {"input": -5}},
        {"tokens": {"input": 1e400}},
        {"tokens": {"bogus": 1}},
        {"status": 1000},
        {"complete": "yes"},
    ],
)
async def test_a_malformed_cost_is_refused(box: Box, bad: dict[str, Any]) -> None:
    await box.models.begin(BROKER, TASK, start("1" * 16))
    given = {**json.loads(part("1" * 16, "end", Tokens(0, 0), status=200)), **bad}
    with pytest.raises(BoxError):
        await box.models.log_cost(BROKER, TASK, json.dumps(given))
    assert len(await box.open()) == 1


async def test_a_start_that_never_reached_the_manager_is_made_up_by_the_end(box: Box) -> None:
    """The attacker fills the disk as message_start passes, so its start part is refused: the
    end says all the reply said, and all of it is charged."""
    await box.models.begin(BROKER, TASK, start("1" * 16))
    end = part("1" * 16, "end", USAGE, status=200, complete=True)
    await box.models.log_cost(BROKER, TASK, end)
    assert (await box.task())["costCents"] == pytest.approx(price_cents(MODEL, USAGE))


async def test_a_request_sent_that_got_no_answer_is_charged_what_it_could_cost(box: Box) -> None:
    """The attacker's request whose reply takes longer than the gateway waits for its head (or
    that its broker cuts off as it stops) went upstream all the same: before, status 0 was an
    error, free, and its yes could be used again."""
    await box.set_task(costCents=99.0)
    asked = (await box.models.begin(BROKER, TASK, start("1" * 16)))["approval"]
    await box.answers.answer_approval(OWNER, asked["id"], True)
    await box.models.begin(BROKER, TASK, start("2" * 16))
    lost = json.dumps({"request": "2" * 16, "part": "end", "status": 0, "sent": True})
    await box.models.log_cost(BROKER, TASK, lost)
    (charged,) = await box.costs()
    assert (charged["cents"], charged["reserved"]) == (pytest.approx(worst()), True)
    # Its yes is spent.
    assert "approval" in await box.models.begin(BROKER, TASK, start("3" * 16))
    # One that never went (unreachable, refused) is free.
    await box.set_task(costCents=0.0)
    await box.models.begin(BROKER, TASK, start("4" * 16, OTHER))
    unsent = json.dumps({"request": "4" * 16, "part": "end", "status": 0, "sent": False})
    await box.models.log_cost(BROKER, TASK, unsent)
    assert len(await box.costs()) == 1


async def test_a_call_waiting_for_the_owner_is_counted_once(box: Box) -> None:
    """The broker's call waiting for the owner is also the record's pending approval: counted
    twice, it made every model request of a Droid task at its budget's edge ask."""
    await box.calls.begin_call(BROKER, TASK, pay("Ada", 30, "pay-1"))
    okay = {"key": "pay-1", "question": "Pay?", "costCents": 30, "tool": "wallet.pay"}
    await box.calls.ask(BROKER, TASK, json.dumps(okay))
    await box.set_task(budgetCents=int(worst() + 31))
    given = {**json.loads(start()), "inFlight": {"pay-1": 30}}
    assert (await box.models.begin(BROKER, TASK, json.dumps(given)))["admitted"]
