"""A task's broker and an app's runner over the wire (boxd/broker/app_link.py,
boxd/wire/app_runner.py): a runner killed mid-run leaves the call unanswered, as a broker's kill
does, and the same key runs again with the same ctx.key; what a runner answers is checked like
any caller's input."""

import asyncio
import json
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from boxd.apps.app_server import AppServer
from boxd.broker import app_link
from boxd.broker.app import make_broker
from boxd.broker.app_link import Apps, cut_off, not_installed
from boxd.reading.caps import MAX_DATA
from boxd.wire.app_runner import too_large
from tests.support.app_serving import runners, sockets
from tests.support.broker_serving import serving
from tests.support.memory_log import MemoryLog, MemoryWaiter, until

# The gate app's runner in a process of its own, as box-app@gate.service runs it: its tool notes
# each key it is run with, and in `hold` never answers.
RUNNER = """
import asyncio, socket, sys
from pathlib import Path
from pydantic import BaseModel
from boxd.apps.app_server import AppServer
from boxd.apps.runner import Runner
from boxd.sdk import App, Tool

where, mode = Path(sys.argv[1]), sys.argv[2]

class Nothing(BaseModel):
    pass

async def through(_, ctx):
    with open(where / "entered", "a") as noted:
        noted.write(ctx.key + "\\n")
    if mode == "hold":
        await asyncio.Event().wait()
    return {"ran": ctx.key}

async def main():
    app = App(name="gate", tools=(Tool("pass", "Waits.", Nothing, through),))
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(where / "gate.sock"))
    listening.listen()
    server = AppServer(Runner("gate", app, "", where, lambda _: {}).answer, None)
    await server.start([listening])
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""
REPO = Path(__file__).resolve().parents[2]
CALL = {"tool": "gate.pass", "input": {}, "key": "k1"}


def start_runner(where: Path, mode: str) -> subprocess.Popen[bytes]:
    (where / "gate.sock").unlink(missing_ok=True)
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(where), mode], stdout=subprocess.PIPE, cwd=REPO
    )
    assert runner.stdout is not None and runner.stdout.readline().strip() == b"ready"
    return runner


def entered(where: Path) -> list[str]:
    noted = where / "entered"
    return noted.read_text().split() if noted.exists() else []


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[tuple[str, MemoryLog, Path]]:
    where = tmp_path / "gate"
    where.mkdir()
    log = MemoryLog("", tools=("gate.pass", "nowhere.thing"))
    served = make_broker(log, MemoryWaiter(log), log.task, Apps(where), wait_seconds=0.3)
    path = str(tmp_path / "broker.sock")
    async with serving(served, path):
        yield path, log, where
    await served.apps.close()


async def post(path: str, body: dict[str, Any]) -> tuple[int, Any]:
    connector = aiohttp.UnixConnector(path=path)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post("http://box/call", json=body) as response,
    ):
        return response.status, await response.json()


async def test_a_runner_killed_mid_run_runs_the_call_again_with_its_key(
    broker: tuple[str, MemoryLog, Path],
) -> None:
    path, log, where = broker
    held = start_runner(where, "hold")
    try:
        call = asyncio.create_task(post(path, CALL))
        await until(lambda: entered(where) == ["k1"])
        held.send_signal(signal.SIGKILL)
        held.wait()
        # Not an answer: nothing is recorded, and the worker asks again (a 503).
        assert await call == (503, {"error": cut_off("gate", "gate.pass")})
        assert log.results == [] and list(log.calls) == ["k1"]
    finally:
        held.kill()
        held.wait()
    again = start_runner(where, "open")
    try:
        assert await post(path, CALL) == (200, {"ok": True, "output": {"ran": "k1"}})
        # The tool got the same key both times: what it did before it was cut off, it finds.
        assert entered(where) == ["k1", "k1"]
        assert [r["key"] for r in log.results] == ["k1"]
        # The answer is the key's for good now: asked again, the tool does not run.
        assert await post(path, CALL) == (200, {"ok": True, "output": {"ran": "k1"}})
        assert entered(where) == ["k1", "k1"]
    finally:
        again.kill()
        again.wait()


async def test_an_app_with_no_runner_is_not_installed(
    broker: tuple[str, MemoryLog, Path],
) -> None:
    path, log, _ = broker
    for tool in ("gate.pass", "nowhere.thing"):
        assert await post(path, {**CALL, "tool": tool}) == (400, {"error": not_installed(tool)})
    assert log.calls == {}


async def test_a_runner_that_never_starts_holds_no_call_for_ever(
    broker: tuple[str, MemoryLog, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The socket takes the connection, as systemd's does while the runner's unit fails to
    start (a full disk once kept it from making its state directory), and no one answers."""
    path, log, where = broker
    monkeypatch.setattr(app_link, "START_SECONDS", 0.1)
    queue = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    queue.bind(str(where / "gate.sock"))
    queue.listen()
    try:
        assert await post(path, CALL) == (
            503,
            {
                "error": "app gate's runner did not start in 0.1 s; the box's owner finds why in "
                "`journalctl -u box-app@gate`"
            },
        )
    finally:
        queue.close()
    assert log.calls == {}


async def fake_runner(where: Path, answer: Callable[[dict[str, Any]], bytes]) -> asyncio.Server:
    """A runner that answers each request with what `answer` makes of it, as an app's code in
    the runner's process could."""

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write(answer(json.loads(line)))
        writer.close()

    return await asyncio.start_unix_server(connected, path=str(where / "gate.sock"))


def checked(cost: Any) -> Callable[[dict[str, Any]], bytes]:
    def answer(request: dict[str, Any]) -> bytes:
        said = {"id": request["id"], "input": {}, "costCents": cost, "needsOk": False}
        return json.dumps(said).encode() + b"\n"

    return answer


@pytest.mark.parametrize("cost", [-5, "5", True, None])
async def test_a_cost_that_is_not_cents_is_refused(
    broker: tuple[str, MemoryLog, Path], cost: Any
) -> None:
    path, log, where = broker
    server = await fake_runner(where, checked(cost))
    try:
        assert await post(path, CALL) == (
            400,
            {"error": "gate.pass gave a cost that is not a number of cents, 0 or more"},
        )
    finally:
        server.close()
    assert log.calls == {}


async def test_a_runner_that_answers_garbage_is_read_no_more(
    broker: tuple[str, MemoryLog, Path],
) -> None:
    path, log, where = broker
    server = await fake_runner(where, lambda request: b"not json\n")
    try:
        # A check is asked again once on a new connection (it changes nothing), then given up.
        assert await post(path, CALL) == (
            503,
            {"error": "the runner of gate.pass went away; call it again"},
        )
    finally:
        server.close()
    assert log.calls == {}


async def test_an_output_too_large_is_recorded_as_the_calls_failure(
    broker: tuple[str, MemoryLog, Path],
) -> None:
    """A runner's own check of the output's size is in the app's process, which the app's code
    could undo: the broker checks again."""
    path, log, where = broker

    def answer(request: dict[str, Any]) -> bytes:
        said: dict[str, Any] = {"id": request["id"]}
        if request["do"] == "check":
            said |= {"input": {}, "costCents": 0, "needsOk": False}
        elif request["do"] == "run":
            said |= {"ok": True, "output": "x" * MAX_DATA}
        return json.dumps(said).encode() + b"\n"

    server = await fake_runner(where, answer)
    try:
        assert await post(path, CALL) == (200, {"ok": False, "error": too_large("gate.pass")})
    finally:
        server.close()
    assert [(r["key"], r["ok"]) for r in log.results] == [("k1", False)]


async def test_answers_on_one_connection_come_as_they_are_ready(tmp_path: Path) -> None:
    async with runners(tmp_path) as apps:
        slow = asyncio.create_task(apps.check("wallet.pay", {"to": "Ada", "cents": 5}))
        quick = await apps.check("echo.say", {"text": "hi"})
        assert quick.input == {"text": "hi"} and quick.cost == 0
        assert (await slow).cost == 5
        tools = await apps.tools(["wallet.pay", "echo.say", "nowhere.thing", "wallet.nothing"])
        assert [t["name"] for t in tools] == ["wallet.pay", "echo.say"]
        assert set(tools[0]) == {"name", "description", "input"}


async def test_an_idle_runner_exits_and_one_told_to_stop_lets_its_runs_finish(
    tmp_path: Path,
) -> None:
    finished = asyncio.Event()
    told: list[dict[str, Any]] = []

    async def answer(request: dict[str, Any]) -> dict[str, Any]:
        if request["do"] == "hello":
            return {"app": "gate"}
        told.append(request)
        await finished.wait()
        return {"ok": True, "output": "done"}

    listening = sockets(tmp_path)
    listening.mkdir()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(listening / "gate.sock"))
    sock.listen()
    server = AppServer(answer, idle_seconds=0.05)
    await server.start([sock])
    await asyncio.wait_for(server.idle.wait(), 5)
    server.idle.clear()
    apps = Apps(listening)
    running = asyncio.create_task(apps.run("gate.pass", {}, "k", {"id": "t000000001"}))
    await until(lambda: len(told) == 1)
    stopping = asyncio.create_task(server.stop())
    await asyncio.sleep(0.1)
    # Neither idle with a run in hand, nor stopped before it answered.
    assert not server.idle.is_set() and not stopping.done()
    finished.set()
    assert await running == {"ok": True, "output": "done"}
    await stopping
    await apps.close()
