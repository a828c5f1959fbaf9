"""A broker waits for the owner's answer with the manager's WaitApproval, answered to that
broker alone (no signal: any broker's user once heard every task's answers), on a real SQLite
record; and the broker's waiter keeps within its time and the bus's limit of unanswered calls."""

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from boxd.broker.approvals import MAX_WAITING, ApprovalWaiter
from boxd.dbus import interface as api
from boxd.errors import BoxError, Problem
from boxd.manager.approval_answers import ApprovalAnswers
from boxd.manager.broker_methods import BrokerMethods
from tests.support.broker_methods import BROKER, OWNER, TASK, open_methods

QUESTION = json.dumps({"key": "q", "question": "May I?"})


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[tuple[BrokerMethods, ApprovalAnswers]]:
    methods, answers, store = await open_methods(tmp_path / "box.db")
    yield methods, answers
    await store.close()


async def test_the_answer_comes_to_the_waiting_call(
    box: tuple[BrokerMethods, ApprovalAnswers],
) -> None:
    methods, answers = box
    asked = await methods.ask(BROKER, TASK, QUESTION)
    waiting = asyncio.create_task(answers.wait_approval(BROKER, TASK, asked["id"], "5000"))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await answers.answer_approval(OWNER, asked["id"], True)
    assert await waiting == {"state": "approved"}
    # Asked again, answered at once.
    assert await answers.wait_approval(BROKER, TASK, asked["id"], "5000") == {"state": "approved"}


async def test_no_answer_in_time_is_pending(box: tuple[BrokerMethods, ApprovalAnswers]) -> None:
    methods, answers = box
    asked = await methods.ask(BROKER, TASK, QUESTION)
    assert await answers.wait_approval(BROKER, TASK, asked["id"], "20") == {"state": "pending"}
    await answers.answer_approval(OWNER, asked["id"], False)
    assert await answers.wait_approval(BROKER, TASK, asked["id"], "0") == {"state": "denied"}


@pytest.mark.parametrize(
    ("args", "problem", "words"),
    [
        ([TASK, "t000000002.q", "10"], Problem.NOT_FOUND, "no approval t000000002.q of task"),
        ([TASK, f"{TASK}.nothing", "10"], Problem.NOT_FOUND, f"no approval {TASK}.nothing"),
        ([TASK, f"{TASK}.q", "-1"], Problem.INVALID, "waitMs is a whole number"),
        ([TASK, f"{TASK}.q", "600001"], Problem.INVALID, "waitMs is a whole number"),
        # Digits int() refuses, or reads though no other program would: a 500 before.
        ([TASK, f"{TASK}.q", "\u00b2"], Problem.INVALID, "waitMs is a whole number"),
        ([TASK, f"{TASK}.q", "\u0663"], Problem.INVALID, "waitMs is a whole number"),
        ([TASK, f"{TASK}.q", "1" * 5000], Problem.INVALID, "waitMs is a whole number"),
    ],
)
async def test_only_the_tasks_own_approval_is_waited_for(
    box: tuple[BrokerMethods, ApprovalAnswers], args: list[str], problem: Problem, words: str
) -> None:
    methods, answers = box
    await methods.ask(BROKER, TASK, QUESTION)
    with pytest.raises(BoxError) as caught:
        await answers.wait_approval(BROKER, *args)
    assert caught.value.problem == problem and caught.value.message.startswith(words)


class Manager:
    """Answers WaitApproval when the test says, noting what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, ...]] = []
        self.answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def call(self, method: api.Method, *args: str) -> Any:
        member = api.bound_on(api.BROKER, method).name
        self.asked.append((member, *args))
        try:
            state = await asyncio.wait_for(asyncio.shield(self.answer), int(args[1]) / 1000)
        except TimeoutError:
            state = "pending"
        return {"state": state}


async def test_the_waiter_asks_for_its_time_and_no_more() -> None:
    manager = Manager()
    waiter = ApprovalWaiter(manager)
    assert await waiter.wait({"id": f"{TASK}.q", "state": "denied"}, 5) == "denied"
    assert manager.asked == []
    waiting = asyncio.create_task(waiter.wait({"id": f"{TASK}.q", "state": "pending"}, 2))
    await asyncio.sleep(0.01)
    [(member, approval, milliseconds)] = manager.asked
    assert (member, approval) == ("WaitApproval", f"{TASK}.q")
    assert 1900 <= int(milliseconds) <= 2000
    manager.answer.set_result("approved")
    assert await waiting == "approved"


async def test_waits_beyond_the_bus_limit_wait_for_a_place() -> None:
    manager = Manager()
    waiter = ApprovalWaiter(manager)
    pending = {"id": f"{TASK}.q", "state": "pending"}
    held = [asyncio.create_task(waiter.wait(pending, 5)) for _ in range(MAX_WAITING)]
    await asyncio.sleep(0.01)
    assert len(manager.asked) == MAX_WAITING
    # No place in its time: pending, without a call the bus would refuse.
    assert await waiter.wait(pending, 0.05) == "pending"
    assert len(manager.asked) == MAX_WAITING
    later = asyncio.create_task(waiter.wait(pending, 5))
    manager.answer.set_result("approved")
    assert await asyncio.gather(*held, later) == ["approved"] * (MAX_WAITING + 1)
