"""What the MCP relay's tests drive it with: the relay as Droid runs it (a process speaking MCP on
its stdin and stdout), the official SDK's stdio client, a raw JSON-RPC line driver for what no
well-behaved client sends, and a scripted broker on a Unix socket."""

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from boxd.workers.broker_patience import PATIENCE_VARIABLE

RELAY = [sys.executable, "-I", "-m", "boxd.workers.mcp.relay"]
# How long a test waits for the relay to say something it expects.
RELAY_SECONDS = 30.0

WALLET_PAY = {
    "name": "wallet.pay",
    "description": "Pay someone from the box's wallet.",
    "input": {
        "type": "object",
        "title": "Pay",
        "properties": {"to": {"type": "string"}, "cents": {"type": "integer"}},
        "required": ["to", "cents"],
    },
}
ECHO_SAY = {
    "name": "echo.say",
    "description": "Say it back.",
    "input": {"type": "object", "properties": {"text": {"type": "string"}}},
}

Answer = Callable[[str, dict[str, Any]], web.StreamResponse]


def ok_output(path: str, body: dict[str, Any]) -> web.StreamResponse:
    if path == "/ask":
        return web.json_response({"approved": True})
    return web.json_response({"ok": True, "output": {"paid": body["input"], "key": body["key"]}})


class ScriptedBroker:
    """Serves GET /tools from `tools` and answers /call and /ask with `answer`, keeping every
    request's body in `requests`."""

    def __init__(self, tools: list[dict[str, Any]]) -> None:
        self.tools = tools
        self.answer: Answer = ok_output
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def keys(self, path: str = "/call") -> list[str]:
        return [body["key"] for asked, body in self.requests if asked == path]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path == "/tools":
            return web.json_response(self.tools)
        body = await request.json()
        self.requests.append((request.path, body))
        return self.answer(request.path, body)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


@asynccontextmanager
async def serving(app: web.Application, path: Path) -> AsyncIterator[None]:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, str(path)).start()
    try:
        yield
    finally:
        await runner.cleanup()


@asynccontextmanager
async def sdk_session(socket_path: Path, errors: Path) -> AsyncIterator[ClientSession]:
    """The relay, started and initialized by the official MCP SDK's client."""
    server = StdioServerParameters(
        command=RELAY[0], args=RELAY[1:], env={"BOX_SOCKET": str(socket_path)}
    )
    with errors.open("a") as errlog:
        async with (
            stdio_client(server, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


class RawRelay:
    """The relay driven line by line: for what the SDK's client never sends. Every line the relay
    writes on stdout must be a JSON-RPC 2.0 message."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self._next_id = 0

    @classmethod
    @asynccontextmanager
    async def start(
        cls, socket_path: Path, patience_ms: int | None = None
    ) -> AsyncIterator["RawRelay"]:
        patience = {} if patience_ms is None else {PATIENCE_VARIABLE: str(patience_ms)}
        process = await asyncio.create_subprocess_exec(
            *RELAY,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"BOX_SOCKET": str(socket_path), **patience},
            limit=64 * 1024 * 1024,
        )
        relay = cls(process)
        try:
            yield relay
        finally:
            if process.returncode is None:
                assert process.stdin is not None
                process.stdin.close()
                await process.wait()

    async def write(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        await self.process.stdin.drain()

    async def send(self, message: dict[str, Any]) -> None:
        await self.write(json.dumps(message).encode() + b"\n")

    async def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Sends a request and returns its answer (result or error), as it comes."""
        self._next_id += 1
        sent: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            sent["params"] = params
        await self.send(sent)
        answer = await self.receive()
        assert answer["id"] == self._next_id, answer
        return answer

    async def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        async with _within("an answer on stdout"):
            line = await self.process.stdout.readline()
        assert line.endswith(b"\n"), f"the relay's stdout ended: {line[:200]!r}"
        message = json.loads(line)
        assert isinstance(message, dict) and message["jsonrpc"] == "2.0", message
        assert ("result" in message) != ("error" in message), message
        return message

    async def stderr_line(self, containing: str) -> str:
        assert self.process.stderr is not None
        seen: list[str] = []
        async with _within(f"{containing!r} on stderr", seen):
            while line := await self.process.stderr.readline():
                if containing in line.decode():
                    return line.decode()
                seen.append(line.decode())
        raise AssertionError(f"the relay never logged {containing!r}: {seen[-5:]}")


@asynccontextmanager
async def _within(waiting_for: str, seen: list[str] | None = None) -> AsyncIterator[None]:
    """A relay that never says what a test waits for fails the test, not hangs it."""
    try:
        async with asyncio.timeout(RELAY_SECONDS):
            yield
    except TimeoutError:
        raise AssertionError(
            f"the relay gave no {waiting_for} in {RELAY_SECONDS:g} s; it said: {(seen or [])[-5:]}"
        ) from None
