"""A broker told to stop lets the tools already running finish and record their results, and
starts no other tool: a tool cut off after it acted (a payment booked) would leave no
tool.result. The tool here is a gate the test holds shut, standing in for one in mid-run."""

import asyncio

from boxd.broker.app import Broker
from boxd.broker.calls import STOPPING
from tests.support.gated_broker import Gate, broker, post
from tests.support.memory_log import MemoryLog, until

__all__ = ["broker"]  # the fixture (tests/support/gated_broker.py)


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
