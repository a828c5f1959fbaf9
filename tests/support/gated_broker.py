"""A broker whose one tool is a gate the test holds open or shut, served as its unit serves it."""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import BaseModel, ConfigDict

from boxd.broker.app import Broker, make_broker
from boxd.sdk import App, Context, Tool
from tests.support.app_serving import runners
from tests.support.broker_serving import serving
from tests.support.memory_log import MemoryLog, MemoryWaiter

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
