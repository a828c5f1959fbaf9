"""The broker on a full disk: steps and calls are refused with a 507 in plain words, nothing is
logged as their answer, and the fake worker waits for room, then goes on where it was.

The manager's record refusing (group_commit's RECORD_FULL) is played by a MemoryLog that raises it;
the wallet's own ledger filling up is real SQLite, kept from growing by max_page_count.
"""

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from boxd.apps import wallet
from boxd.apps.runner import tool_full
from boxd.dbus.interface import BROKER, Method, bound_on
from boxd.errors import BoxError, Problem
from boxd.manager.record.group_commit import RECORD_FULL
from boxd.manager.record.task_flush import STEP_NOT_FLUSHED
from boxd.workers import broker_client, fake
from tests.support.memory_log import MemoryLog, serving, until

# One cent each, so the many calls below stay within the budget and never wait for an OK.
PAY = {"to": "Ada", "cents": 1, "memo": "m" * 500}


class FullLog(MemoryLog):
    """A manager whose record refuses the members in `full` as a full disk does."""

    def __init__(self, prompt: str, tools: tuple[str, ...]) -> None:
        super().__init__(prompt, tools=tools, budget=100)
        self.full: set[str] = set()
        self.refused: list[str] = []

    async def call(self, method: Method, *args: str) -> Any:
        member = bound_on(BROKER, method).name
        if member in self.full:
            self.refused.append(member)
            raise BoxError(Problem.FULL, RECORD_FULL)
        return await super().call(method, *args)


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[tuple[str, FullLog]]:
    log = FullLog("", tools=("wallet.pay", "wallet.balance"))
    async with serving(log, tmp_path) as path:
        yield path, log


async def post(path: str, route: str, body: dict[str, Any]) -> tuple[int, Any]:
    connector = aiohttp.UnixConnector(path=path)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(f"http://box{route}", json=body) as response,
    ):
        return response.status, await response.json()


async def test_a_full_record_refuses_steps_and_calls_with_507_in_words(
    broker: tuple[str, FullLog],
) -> None:
    path, log = broker
    log.full = {"LogStep", "BeginCall"}
    assert await post(path, "/step", {"text": "a"}) == (507, {"error": RECORD_FULL})
    call = {"tool": "wallet.pay", "input": PAY, "key": "k1"}
    assert await post(path, "/call", call) == (507, {"error": RECORD_FULL})
    assert log.steps == [] and log.results == []
    # Room again: the same requests go through, the call once.
    log.full = set()
    status, _ = await post(path, "/step", {"text": "a"})
    assert status == 200
    status, paid = await post(path, "/call", call)
    assert status == 200 and paid["ok"] is True
    assert [step["text"] for step in log.steps] == ["a"]
    assert [result["key"] for result in log.results] == ["k1"]


async def test_a_step_whose_files_cannot_be_flushed_is_refused_unlogged(
    broker: tuple[str, FullLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manager flushes a step's files (boxd.manager.record.task_flush) and refuses it when the
    disk is full: the broker passes the 507 and its words on as they are."""
    path, log = broker

    async def not_flushed(member: str, *args: str) -> Any:
        raise BoxError(Problem.FULL, STEP_NOT_FLUSHED)

    monkeypatch.setattr(log, "call", not_flushed)
    assert await post(path, "/step", {"text": "a"}) == (507, {"error": STEP_NOT_FLUSHED})
    assert log.steps == []


async def test_a_tool_that_meets_a_full_disk_is_not_answered_and_runs_again_once(
    broker: tuple[str, FullLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wallet's ledger cannot grow: the call is refused, not logged as failed for good (its
    key would then say "failed" for ever); the same key later books it once."""
    path, log = broker
    status, first = await post(path, "/call", {"tool": "wallet.pay", "input": PAY, "key": "k0"})
    assert status == 200 and first["ok"] is True
    real_open = wallet._open

    def full_open(state_dir: Path) -> sqlite3.Connection:
        db = real_open(state_dir)
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {pages}")
        return db

    monkeypatch.setattr(wallet, "_open", full_open)
    refused: tuple[int, Any] | None = None
    for number in range(1, 60):
        call = {"tool": "wallet.pay", "input": PAY, "key": f"k{number}"}
        answer = await post(path, "/call", call)
        if answer[0] != 200:
            refused = answer
            break
    assert refused == (507, {"error": tool_full("wallet.pay")}), refused
    assert f"k{number}" not in {result["key"] for result in log.results}
    monkeypatch.setattr(wallet, "_open", real_open)
    status, booked = await post(path, "/call", call)
    assert status == 200 and booked["ok"] is True, booked
    assert booked["output"]["booking"] == f"k{number}"
    status, balance = await post(path, "/call", {"tool": "wallet.balance", "key": "b"})
    assert balance["output"]["payments"] == number + 1


async def test_the_fake_worker_waits_for_room_and_goes_on(
    broker: tuple[str, FullLog], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, log = broker
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(broker_client, "FULL_PAUSE_SECONDS", 0.01)
    log.prompt = 'step one\ncall wallet.pay {"to": "Ada", "cents": 30}\nstep three'
    log.full = {"LogStep", "BeginCall"}
    worker = asyncio.create_task(fake.run(path))
    # Far more refusals than the patience of a broker gone would allow, and it still waits.
    await until(lambda: len(log.refused) >= 20)
    assert not worker.done() and log.steps == []
    log.full = set()
    await worker
    assert [step["text"] for step in log.steps][::2] == ["one", "three"]
    assert log.steps[1]["text"].startswith('wallet.pay: {"booking": "line-2"')
    assert [result["key"] for result in log.results] == ["line-2"]


async def test_a_call_whose_result_cannot_be_logged_books_once_when_sent_again(
    broker: tuple[str, FullLog],
) -> None:
    """The wallet booked, then the record could not take the result: the 507 tells the worker
    to send it again, and the same key (the same ctx.key) finds the booking it made."""
    path, log = broker
    log.full = {"FinishCall"}
    call = {"tool": "wallet.pay", "input": PAY, "key": "k1"}
    assert await post(path, "/call", call) == (507, {"error": RECORD_FULL})
    assert log.results == []
    log.full = set()
    status, paid = await post(path, "/call", call)
    assert status == 200 and paid["ok"] is True and paid["output"]["booking"] == "k1"
    status, balance = await post(path, "/call", {"tool": "wallet.balance", "key": "b"})
    assert balance["output"]["payments"] == 1
