"""The broker's HTTP API on a real Unix socket, driven by the real fake worker.

The manager behind the broker is an in-memory log here; the real one, over D-Bus with polkit
and systemd, is exercised in tests/vm.
"""

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from boxd.broker.app import make_app
from boxd.workers import fake
from boxd.workers.broker_client import BrokerClient, BrokerRefused


class MemoryLog:
    def __init__(self, prompt: str, steps: list[dict[str, Any]] | None = None) -> None:
        self.prompt = prompt
        self.steps = steps or []

    async def call(self, member: str, *args: str) -> Any:
        if member == "GetTask":
            return {"task": {"id": "t000000001", "prompt": self.prompt}, "steps": self.steps}
        assert member == "LogStep"
        step = json.loads(args[0])
        self.steps.append(step)
        return {"seq": len(self.steps), "task": "t000000001", "kind": "task.step", "data": step}


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[tuple[str, MemoryLog]]:
    log = MemoryLog("")
    runner = web.AppRunner(make_app(log, tmp_path))
    await runner.setup()
    path = str(tmp_path / "broker.sock")
    await web.UnixSite(runner, path).start()
    yield path, log
    await runner.cleanup()


async def test_runs_every_command(
    broker: tuple[str, MemoryLog], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, log = broker
    monkeypatch.chdir(tmp_path)
    log.prompt = "\n".join(
        [
            "step Planning",
            "write notes/a.txt hello there",
            "sh cat notes/a.txt",
            "",
            "# a comment",
            "write b.txt x",
            "delete b.txt",
            "sleep 0.01",
        ]
    )
    await fake.run(path)
    assert [(s["text"], s["data"]["line"]) for s in log.steps] == [
        ("Planning", 1),
        ("wrote notes/a.txt", 2),
        ("hello there", 3),
        ("wrote b.txt", 6),
        ("deleted b.txt", 7),
        ("slept 0.01 s", 8),
    ]
    assert (tmp_path / "notes/a.txt").read_text() == "hello there"
    assert not (tmp_path / "b.txt").exists()


async def test_resumes_after_the_last_logged_line(
    broker: tuple[str, MemoryLog], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, log = broker
    monkeypatch.chdir(tmp_path)
    log.prompt = "step one\nstep two\nstep three"
    log.steps = [{"text": "one", "data": {"line": 1}}, {"text": "two", "data": {"line": 2}}]
    await fake.run(path)
    assert [s["text"] for s in log.steps] == ["one", "two", "three"]


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("step a\nfail the disk is full", "line 2: the disk is full"),
        ("dance wildly", "line 1: unknown command 'dance'"),
        ("sh exit 3", "line 1: sh 'exit 3' exited with status 3: "),
        ("delete nowhere.txt", "line 1: delete: there is no nowhere.txt"),
        ("sleep soon", "line 1: sleep needs a number of seconds, not 'soon'"),
        ("call wallet.pay {}", "line 1: call is not available on this box yet"),
    ],
)
async def test_failures_say_which_line(
    broker: tuple[str, MemoryLog],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    script: str,
    message: str,
) -> None:
    path, log = broker
    monkeypatch.chdir(tmp_path)
    log.prompt = script
    with pytest.raises(fake.ScriptFailed) as caught:
        await fake.run(path)
    assert str(caught.value) == message


async def test_broker_errors_are_json(broker: tuple[str, MemoryLog]) -> None:
    path, _ = broker
    async with BrokerClient(path) as client:
        assert await client.get("/tools") == []
        with pytest.raises(BrokerRefused, match=r"^text is missing$"):
            await client.post("/step", {"data": 1})
        with pytest.raises(BrokerRefused, match=r"^unknown field colour$"):
            await client.post("/step", {"text": "a", "colour": "red"})
        with pytest.raises(BrokerRefused, match="no such request: GET /nothing"):
            await client.get("/nothing")
    connector = aiohttp.UnixConnector(path=path)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.post("http://box/step", data=b"{not json") as response:
            assert response.status == 400
            assert (await response.json())["error"].startswith("the body is not valid JSON")
        async with session.post("http://box/step", data=b"x" * (10 * 1024 * 1024 + 1)) as response:
            assert response.status == 413
            assert await response.json() == {"error": "the body is over 10 MB"}
