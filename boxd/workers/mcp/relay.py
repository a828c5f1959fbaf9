"""The MCP relay: Droid's and Claude Code's `box` MCP server, run inside the task as
`python -I -m boxd.workers.mcp.relay` with BOX_SOCKET in its environment.

It holds no secrets: every tool call goes to the task's broker (boxd.workers.mcp.tools says
with which keys). It speaks MCP's stdio transport itself, newline-delimited JSON-RPC 2.0 on
stdin and stdout, with the standard library only: Droid waits for its MCP servers before its
first model request, on every start and resume, and the official SDK takes several times as long
to import as this whole relay takes to answer (docs/decisions.md; bench/mcp_relay.py).
The SDK's own client checks this server in tests/workers/mcp/test_relay.py.

stdout carries the protocol and nothing else; logs go to stderr, which Droid keeps.
"""

# First, when this module is the program: asyncio without ssl, as a task's processes have it
# (boxd/patches/asyncio.py). Imported as a library (by the worker started ahead, by tests), it
# leaves that to the program.
from boxd.patches.asyncio import import_asyncio_without_ssl

if __name__ == "__main__":
    import_asyncio_without_ssl()

import asyncio
import json
import logging
import os
import sys
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from boxd.workers import unix_http
from boxd.workers.mcp.tools import Broker, PermissionAnswers, Relay, UnknownTool
from boxd.workers.unix_http import BROKER_FAILURES

log = logging.getLogger("boxd.workers.mcp.relay")

# Protocol revisions whose stdio transport and tools this server speaks, oldest first; the last
# is the one offered to a client that asks for another.
PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
SERVER_INFO = {"name": "box", "version": "1"}
INSTRUCTIONS = (
    "The box's tools run outside your sandbox, with the box owner's accounts and secrets; each "
    "call is logged, and spending may wait for the owner's OK. An answer that says it is waiting "
    "is not an error: call the same tool again with exactly the same input to keep waiting."
)
# One message, one line. Droid's own messages are small; a larger line is refused, not read.
MAX_LINE = 16 * 1024 * 1024
MAX_LINE_WORDS = "16 MiB"
_CHUNK = 64 * 1024

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603


class Writer(Protocol):
    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


# Tasks that run beside the server, held so they are not collected mid-run.
_keep: set[asyncio.Task[None]] = set()


class _Refusal(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


async def lines(stream: asyncio.StreamReader, cap: int = MAX_LINE) -> AsyncIterator[bytes | None]:
    """Each line of `stream` without its newline, or None for a line over `cap`: its bytes are
    dropped as they come, so no line holds more than `cap` in memory."""
    held = bytearray()
    skipping = False
    while chunk := await stream.read(_CHUNK):
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            piece = chunk[start:end]
            start = end + 1
            if skipping or len(held) + len(piece) > cap:
                skipping = False
                held.clear()
                yield None
            else:
                held += piece
                line = bytes(held)
                held.clear()
                yield line
        rest = chunk[start:]
        if not skipping and len(held) + len(rest) > cap:
            held.clear()
            skipping = True
        elif not skipping:
            held += rest
    if skipping:
        yield None
    elif held:
        yield bytes(held)


class Server:
    def __init__(self, relay: Relay, writer: Writer) -> None:
        self._relay = relay
        self._writer = writer
        self._writing = asyncio.Lock()
        self._running: set[asyncio.Task[None]] = set()

    async def serve(self, stream: asyncio.StreamReader) -> None:
        """Until the client closes stdin. Requests run side by side: a call that waits for the
        owner does not hold up a ping or another call."""
        try:
            async for line in lines(stream):
                await self._take(line)
        finally:
            for task in self._running:
                task.cancel()
            await asyncio.gather(*self._running, return_exceptions=True)

    async def _take(self, line: bytes | None) -> None:
        if line is None:
            await self._refuse(
                None,
                PARSE_ERROR,
                f"the message is over {MAX_LINE_WORDS}; this server reads at most "
                f"{MAX_LINE_WORDS} a line, and skipped it",
            )
            return
        if not line.strip():
            return
        try:
            message = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            await self._refuse(None, PARSE_ERROR, f"the message is not JSON: {error}")
            return
        if isinstance(message, list):
            await self._refuse(
                None, INVALID_REQUEST, "batches are not supported: send one message a line"
            )
            return
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            given = message.get("id") if isinstance(message, dict) else None
            await self._refuse(
                _valid_id(given),
                INVALID_REQUEST,
                'a message must be a JSON-RPC 2.0 object, "jsonrpc": "2.0"',
            )
            return
        if "method" not in message:
            return  # an answer to a request this server never sends
        if "id" not in message:
            return  # a notification: none needs anything of this server
        request_id = message["id"]
        if _valid_id(request_id) is None:
            await self._refuse(None, INVALID_REQUEST, "id must be a string or an integer")
            return
        task = asyncio.create_task(
            self._answer(request_id, message["method"], message.get("params"))
        )
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _answer(self, request_id: Any, method: Any, params: Any) -> None:
        try:
            result = await self._result(method, params if isinstance(params, dict) else {})
        except _Refusal as refusal:
            await self._refuse(request_id, refusal.code, refusal.message)
            return
        except Exception as error:
            # Whatever went wrong, the client gets an answer and the relay goes on.
            log.exception("%s failed", method)
            await self._refuse(request_id, INTERNAL_ERROR, f"{method} failed in the relay: {error}")
            return
        await self._send({"jsonrpc": "2.0", "id": request_id, "result": result})

    async def _result(self, method: Any, params: dict[str, Any]) -> dict[str, Any]:
        if method == "initialize":
            asked = params.get("protocolVersion")
            return {
                "protocolVersion": asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[-1],
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": SERVER_INFO,
                "instructions": INSTRUCTIONS,
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            try:
                return {"tools": await self._relay.list()}
            except (unix_http.BrokerRefused, unix_http.BrokerGone, unix_http.BrokerGarbled) as why:
                raise _Refusal(
                    INTERNAL_ERROR, f"the box's tools could not be listed: {why}"
                ) from None
        if method == "tools/call":
            return await self._call(params)
        shown = method if isinstance(method, str) else json.dumps(method)[:100]
        raise _Refusal(
            METHOD_NOT_FOUND,
            f"no method {shown}: this server answers initialize, ping, tools/list and tools/call",
        )

    async def _call(self, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("name")
        arguments = params.get("arguments")
        if not isinstance(name, str):
            raise _Refusal(INVALID_PARAMS, "tools/call needs name, the tool's name")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise _Refusal(INVALID_PARAMS, f"the arguments of {name} must be a JSON object")
        try:
            return await self._relay.call(name, arguments)
        except UnknownTool as unknown:
            raise _Refusal(INVALID_PARAMS, str(unknown)) from None
        except BROKER_FAILURES as why:
            raise _Refusal(INTERNAL_ERROR, f"the box's tools could not be listed: {why}") from None

    async def _refuse(self, request_id: Any, code: int, message: str) -> None:
        error = {"code": code, "message": message}
        await self._send({"jsonrpc": "2.0", "id": request_id, "error": error})

    async def _send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n"
        async with self._writing:
            self._writer.write(line.encode("utf-8"))
            await self._writer.drain()


def _valid_id(value: Any) -> Any:
    """The request's id if JSON-RPC allows it (a string or an integer), else None."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return None


class _FileWriter:
    """stdout as a regular file (a person's `> out`): a write there does not wait for a reader."""

    def write(self, data: bytes) -> None:
        sys.stdout.buffer.write(data)

    async def drain(self) -> None:
        sys.stdout.buffer.flush()


async def _file_reader(reader: asyncio.StreamReader) -> None:
    while chunk := await asyncio.to_thread(os.read, sys.stdin.fileno(), _CHUNK):
        reader.feed_data(chunk)
    reader.feed_eof()


async def _stdio() -> tuple[asyncio.StreamReader, Writer]:
    """stdin and stdout as asyncio streams: pipes, as Droid and every MCP client give them, or
    regular files for a person trying the relay by hand."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    except ValueError:
        feeding = asyncio.create_task(_file_reader(reader))
        _keep.add(feeding)
    writer: Writer
    try:
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, sys.stdout.buffer
        )
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    except ValueError:
        writer = _FileWriter()
    return reader, writer


async def run(socket_path: str) -> None:
    reader, writer = await _stdio()
    broker = partial(unix_http.request, socket_path)
    relay = Relay(broker, _permissions(broker))
    await Server(relay, writer).serve(reader)


def _permissions(broker: Broker) -> PermissionAnswers | None:
    """Claude Code's worker sets the task's autonomy for its prompts; Droid's does not."""
    from boxd.workers.mcp import permission

    autonomy = os.environ.get(permission.AUTONOMY_VARIABLE)
    if not autonomy:
        return None
    plan = os.environ.get(permission.PLAN_VARIABLE) == "1"
    home = os.environ.get(permission.HOME_VARIABLE)
    work = os.environ.get(permission.WORK_VARIABLE)
    if not home or not work:
        sys.exit(
            f"box mcp: {permission.HOME_VARIABLE} and {permission.WORK_VARIABLE} must be set "
            "beside the autonomy; the Claude worker's MCP configuration sets them"
        )
    return permission.Permissions(
        broker, autonomy=autonomy, plan=plan, home=Path(home), work=Path(work)
    )


def main() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="box mcp: %(message)s")
    socket_path = os.environ.get("BOX_SOCKET")
    if not socket_path:
        sys.exit("box mcp: BOX_SOCKET is not set; a task's worker starts this relay for it")
    asyncio.run(run(socket_path))


if __name__ == "__main__":
    main()
