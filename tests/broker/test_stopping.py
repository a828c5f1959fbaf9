"""A broker told to stop lets the tools already running finish and record their results, and
starts no other tool: a tool cut off after it acted (a payment booked) would leave no
tool.result. The tool here is a gate the test holds shut, standing in for one in mid-run."""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import BaseModel, ConfigDict

from boxd.broker.app import Broker, make_broker
from boxd.broker.calls import STOPPING
from boxd.sdk import App, Context, Tool
from tests.broker.test_broker_and_fake_worker import MemoryLog, MemoryWaiter, until
from tests.support.app_serving import runners
from tests.support.broker_serving import serving

TOOL = "gate.pass"


class Nothing(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Gate:
    """A tool that waits until the test opens it."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.entered: list[str] = []
        self.ran: list[str] = []
        self.app = App(name="gate", tools=(Tool("pass", "Waits.", Nothing, self._pass),))

    async def _pass(self, _: Nothing, context: Context) -> dict[str, Any]:
        self.entered.append(context.key)
        await self.open.wait()
        self.ran.append(context.key)
        return {"ran": context.key}


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[tuple[str, MemoryLog, Gate, Broker]]:
    gate = Gate()
    log = MemoryLog("", tools=(TOOL,))
    path = str(tmp_path / "broker.sock")
    async with runners(tmp_path, {"gate": gate.app}) as apps:
        broker = make_broker(log, MemoryWaiter(log), log.task, apps, wait_seconds=0.3)
        async with serving(broker, path):
            yield path, log, gate, broker
            gate.open.set()


async def post(path: str, key: str) -> tuple[int, Any]:
    connector = aiohttp.UnixConnector(path=path)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post("http://box/call", json={"tool": TOOL, "key": key}) as response,
    ):
        return response.status, await response.json()


async def test_a_tool_running_when_the_broker_stops_records_its_result_first(
    broker: tuple[str, MemoryLog, Gate, Broker],
) -> None:
    path, log, gate, served = broker
    # Its client hangs up, as a killed worker does: the run goes on all the same.
    caller = asyncio.create_task(post(path, "k1"))
    await until(lambda: gate.entered == ["k1"])
    caller.cancel()
    stopping = asyncio.create_task(served.calls.finish())
    await asyncio.sleep(0)
    assert not stopping.done()
    gate.open.set()
    await stopping
    assert gate.ran == ["k1"]
    assert [(r["key"], r["ok"], r["output"]) for r in log.results] == [("k1", True, {"ran": "k1"})]


async def test_no_tool_starts_once_the_broker_is_stopping(
    broker: tuple[str, MemoryLog, Gate, Broker],
) -> None:
    path, log, gate, served = broker
    await served.calls.finish()
    assert await post(path, "k2") == (503, {"error": STOPPING})
    assert gate.entered == [] and log.results == []


async def test_the_wait_for_running_tools_is_bounded(
    broker: tuple[str, MemoryLog, Gate, Broker],
) -> None:
    path, log, gate, served = broker
    caller = asyncio.create_task(post(path, "k3"))
    await until(lambda: gate.entered == ["k3"])
    await served.calls.finish(seconds=0.05)
    assert gate.ran == [] and log.results == []
    gate.open.set()
    assert await caller == (200, {"ok": True, "output": {"ran": "k3"}})
