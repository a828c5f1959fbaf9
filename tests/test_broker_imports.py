"""A broker starts with every task and on the first request after it exited idle, so what it
imports is on that path: not the manager's models, the App SDK, the tools' models, nor pydantic
at all. It reads its requests with boxd.reading.json_reader, so a task that logs steps, asks, and
says its costs never loads pydantic; and a tool runs in its app's runner (box-app@.service), so a
broker that calls tools loads no app, no App SDK and no pydantic either."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The echo app's runner, in a process of its own as box-app@echo.service runs it.
_RUNNER = """
import asyncio, socket, sys
from pathlib import Path
from boxd.apps.app_server import AppServer
from boxd.apps.echo import app
from boxd.apps.runner import Runner

async def main():
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(sys.argv[1])
    listening.listen()
    server = AppServer(Runner("echo", app, "", Path(sys.argv[2]), lambda _: {}).answer, None)
    await server.start([listening])
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""

# A broker of a task with one tool, served on a Unix socket by its own server, asked over raw
# HTTP (an HTTP client would import what is looked for), its manager answered in memory.
_LOOK = """
# First, as the broker's console script (boxd/main.py) does: asyncio without ssl, then the broker.
from boxd.patches.asyncio import import_asyncio_without_ssl
import_asyncio_without_ssl()
import boxd.broker.main
import sys
imported = sorted(sys.modules)
import asyncio, json, subprocess, tempfile
from pathlib import Path
from boxd.broker.app import make_broker
from boxd.broker.app_link import Apps
from boxd.dbus.interface import BROKER, bound_on
from tests.support.broker_serving import serving


TASK = {"id": "t000000001", "tools": ["echo.say"], "budgetCents": 100, "costCents": 0}

class Manager:
    async def call(self, method, *args):
        member = bound_on(BROKER, method).name
        if member == "GetTask":
            return {"task": TASK, "steps": []}
        if member == "Ask":
            return {"id": "t000000001.k", "state": "approved"}
        if member == "BeginCall":
            return {"answered": None, "spentCents": 0, "reservedCents": {}, "approval": None}
        if member == "FinishCall":
            answer = {"ok": True, "output": json.loads(args[0])["output"]}
            return {"answered": answer, "spentCents": 0}
        return {"seq": 1, "data": json.loads(args[0])}

class Waiter:
    async def wait(self, approval, seconds):
        return approval["state"]

async def ask(path, method, target, body=b""):
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(
        f"{method} {target} HTTP/1.1\\r\\nHost: box\\r\\nContent-Type: application/json\\r\\n"
        f"Content-Length: {len(body)}\\r\\nConnection: close\\r\\n\\r\\n".encode() + body
    )
    answer = await reader.read()
    writer.close()
    head, _, body = answer.partition(b"\\r\\n\\r\\n")
    if b"chunked" in head.lower():
        chunks = b""
        while True:
            size, _, body = body.partition(b"\\r\\n")
            if int(size, 16) == 0:
                break
            chunks += body[: int(size, 16)]
            body = body[int(size, 16) + 2 :]
        body = chunks
    return int(head.split(b" ", 2)[1]), json.loads(body or b"null")

TOOL_CALL = b'{"tool": "echo.say", "input": {"text": "hi"}, "key": "t"}'
REQUESTS = [
    ("GET", "/task", b""),
    ("POST", "/step", b'{"text": "read the files", "data": {"n": 1}}'),
    ("POST", "/step", b'{"text": 1}'),
    ("POST", "/ask", b'{"question": "May I?", "key": "k", "costCents": 5}'),
    ("POST", "/ask", b'{"question": "May I?"}'),
    ("POST", "/cost", b'{"cents": 1.5, "what": "a search"}'),
    ("POST", "/cost", b'{"cents": true, "what": "a search"}'),
    ("POST", "/usage", b'{"model": "claude-sonnet-4-6", "tokens": {"input": 10, "output": 2}}'),
    ("POST", "/usage", b'{"model": "m", "tokens": {"input": 1.0, "output": 2}}'),
    ("POST", "/call", b'{"tool": "wallet.pay", "key": "k"}'),
    ("POST", "/call", b'{"tool": "echo.say", "key": 7}'),
]

async def main():
    with tempfile.TemporaryDirectory() as home:
        runner = subprocess.Popen(
            [sys.executable, "-c", sys.argv[1], f"{home}/echo.sock", home], stdout=subprocess.PIPE
        )
        try:
            assert runner.stdout.readline().strip() == b"ready"
            manager = Manager()
            broker = make_broker(manager, Waiter(), TASK, Apps(Path(home)), 0.01)
            path = str(Path(home) / "broker.sock")
            async with serving(broker, path):
                answers = [[*request[:2], *await ask(path, *request)] for request in REQUESTS]
                served = sorted(sys.modules)
                tool = await ask(path, "POST", "/call", TOOL_CALL)
                print(json.dumps({
                    "imported": imported,
                    "served": served,
                    "answers": answers,
                    "tool": [*tool, "pydantic" in sys.modules],
                    "after_tool": sorted(sys.modules),
                }))
            await broker.apps.close()
        finally:
            runner.kill()
            runner.wait()

asyncio.run(main())
"""


def _look() -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _LOOK, _RUNNER],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    found: dict[str, object] = json.loads(done.stdout)
    return found


def test_the_broker_imports_no_model_of_the_manager_nor_the_apps_nor_pydantic() -> None:
    modules = _look()["imported"]
    assert isinstance(modules, list)
    # The pydantic half of the wire, whole (boxd/wire/__init__.py).
    assert [name for name in modules if name.startswith("boxd.wire.models.")] == []
    for name in (
        "boxd.wire.models.approval_record",
        "boxd.wire.models.event_record",
        "boxd.wire.models.key_use",
        "boxd.sdk",
        "boxd.apps.echo",
        "boxd.wire.models.task",
        "boxd.wire.models.task_request",
        "boxd.manager",
        "boxd.wire.models.broker_calls",
        "boxd.wire.models.plain_errors",
        # Its requests are read by boxd.reading.json_reader: pydantic and its model machinery were
        # ~22 ms and some 7.5 MiB of each broker's own heap.
        "pydantic",
        "pydantic_core",
        "annotated_types",
        # The installed packages' entry points are read by the manager and the apps' runners.
        "importlib.metadata",
        "boxd.apps.entry_points",
        # The broker keeps no database: boxd.errors.is_full does not load SQLite.
        "sqlite3",
        # Its own HTTP server (boxd/broker/http_server.py): aiohttp cost each broker 180 ms to
        # import and 13 MiB; the model gateway imports it on its first connection.
        "aiohttp",
        # asyncio comes without it (boxd/patches/asyncio.py): memory of a broker that speaks no
        # TLS (docs/performance.md, "asyncio without ssl").
        "ssl",
    ):
        assert name not in modules, f"the broker imports {name} as it starts"


def test_steps_asks_costs_usage_and_tools_load_no_pydantic() -> None:
    found = _look()
    served = found["served"]
    assert isinstance(served, list)
    for name in ("pydantic", "pydantic_core", "annotated_types", "boxd.sdk", "aiohttp", "ssl"):
        assert name not in served, f"the broker's first requests import {name}"
    answers = found["answers"]
    assert isinstance(answers, list)
    assert [answer[:3] for answer in answers] == [
        ["GET", "/task", 200],
        ["POST", "/step", 200],
        ["POST", "/step", 400],
        ["POST", "/ask", 200],
        ["POST", "/ask", 400],
        ["POST", "/cost", 200],
        ["POST", "/cost", 400],
        ["POST", "/usage", 200],
        ["POST", "/usage", 400],
        ["POST", "/call", 400],
        ["POST", "/call", 400],
    ]
    bodies = [answer[3] for answer in answers]
    assert bodies[0]["task"]["id"] == "t000000001"
    assert bodies[1]["data"] == {"text": "read the files", "data": {"n": 1}}
    assert bodies[2] == {"error": "text must be a string"}
    assert bodies[3] == {"approved": True}
    assert bodies[4] == {"error": "a key is required"}
    assert bodies[5]["data"] == {"cents": 1.5, "what": "a search"}
    assert bodies[6]["error"].startswith("cents must be a number of US cents")
    assert bodies[7]["data"]["tokens"] == {
        "input": 10,
        "output": 2,
        "cacheWrite": 0,
        "cacheRead": 0,
    }
    assert bodies[8] == {"error": "tokens.input: input should be a valid integer"}
    assert bodies[9]["error"].startswith("this task may not call wallet.pay")
    assert bodies[10] == {"error": "key must be a string"}
    # The tool's input model is pydantic's (the App SDK's): its app's runner loads it.
    assert found["tool"] == [200, {"ok": True, "output": {"text": "hi"}}, False]


def test_a_broker_that_ran_a_tool_loads_no_app() -> None:
    # What a broker imports it holds for good: an app, its models, the App SDK and pydantic
    # once came with a task's first tool, into every broker that ran one.
    modules = _look()["after_tool"]
    assert isinstance(modules, list)
    for name in (
        "boxd.apps.echo",
        "boxd.sdk",
        "pydantic",
        "boxd.apps.mail",
        "boxd.apps.wallet",
        "smtplib",
        "sqlite3",
        "importlib.metadata",
        "email",
        "zipfile",
        "ssl",
    ):
        assert name not in modules, f"a broker that ran echo.say imports {name}"
