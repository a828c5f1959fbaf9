"""The broker over its Unix socket with the standard library only: JSON in and out, the answer
read up to a cap; one request per connection (`request`, `exchange`), or connections kept open
between requests (`Connections`). Both speak HTTP/1.1, whose chunks tell an answer cut off
(GET /task's pages of steps, streamed) from a whole one.

The MCP relay and the workers' broker_client talk to the broker through this rather than
aiohttp, whose import costs several times what the rest of them does: Droid waits for its MCP
servers before its first model request, on every start and resume (bench/mcp_relay.py), and a
task's first step waits for its worker's imports (bench/start_latency.py).
"""

import asyncio
import json
import logging
from typing import Any

from boxd.errors import Problem
from boxd.reading.decimal_text import decimal
from boxd.reading.strict_json import MAX_BODY
from boxd.workers.broker_patience import FULL_PAUSE_SECONDS, Patience

log = logging.getLogger(__name__)

# The broker's largest answer is a tool's output (1 MB as compact JSON) in its envelope; a
# request body may be 10 MB, and no answer of the broker's comes near that.
MAX_ANSWER = MAX_BODY
# A status line or header; the broker's are a few dozen characters.
MAX_HEAD_LINE = 8 * 1024
MAX_HEADERS = 100
_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
# The broker's "the manager is away" status: nothing was done, ask again.
MANAGER_AWAY = 503
# The broker's "the box's disk is full" status: nothing was done, ask again once there is room.
DISK_FULL = Problem.FULL.http_status


class BrokerRefused(Exception):
    """The broker answered with an error status; the text is its words."""


class BrokerGone(Exception):
    """The broker could not be reached, cut the answer off, or had its manager away, for longer
    than broker_patience says to wait."""


class _ManagerAway(Exception):
    """A 503: the broker is up, its manager is not; the words are the broker's."""


class _DiskFull(Exception):
    """A 507: the box's disk is full and nothing was done; the words are the broker's."""


class BrokerGarbled(Exception):
    """The broker answered something that is not an HTTP answer with JSON in it."""


BROKER_FAILURES = (BrokerRefused, BrokerGone, BrokerGarbled)

# What a connection that breaks looks like: refused while systemd restarts the broker, reset or
# cut short when it is killed mid-answer.
LOST = (ConnectionError, FileNotFoundError, asyncio.IncompleteReadError)


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = await reader.readuntil(b"\n")
    parts = status_line.decode("latin-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or decimal(parts[1], 3) is None:
        raise BrokerGarbled(f"the broker's answer does not start as HTTP: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS):
        line = await reader.readuntil(b"\n")
        if line in (b"\r\n", b"\n"):
            return int(parts[1]), headers
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    raise BrokerGarbled(f"the broker's answer has more than {MAX_HEADERS} headers")


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    length = headers.get("content-length")
    if length is not None:
        size = decimal(length)
        if size is None:
            raise BrokerGarbled(f"the broker's answer has a bad Content-Length: {length[:40]!r}")
        if size > MAX_ANSWER:
            raise BrokerGarbled(f"the broker's answer is over {MAX_ANSWER:,} bytes")
        return await reader.readexactly(size)
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return await _chunks(reader)
    # No length: HTTP/1.0 says the body ends where the connection does.
    body = bytearray()
    while chunk := await reader.read(64 * 1024):
        body += chunk
        if len(body) > MAX_ANSWER:
            raise BrokerGarbled(f"the broker's answer is over {MAX_ANSWER:,} bytes")
    return bytes(body)


async def _chunks(reader: asyncio.StreamReader) -> bytes:
    """A chunked body (HTTP/1.1), as the broker streams GET /task's pages of steps."""
    body = bytearray()
    while True:
        size_line = (await reader.readuntil(b"\n")).split(b";", 1)[0].strip()
        # Hex digits only, as HTTP says: int() would also take "-1", "+1", "0x1" and "1_0".
        if not size_line or not _HEX_DIGITS.issuperset(size_line):
            words = f"the broker's answer has a bad chunk size: {size_line[:40]!r}"
            raise BrokerGarbled(words)
        size = int(size_line, 16)
        if size == 0:
            # Trailers, if any, up to the empty line that ends the answer.
            while (await reader.readuntil(b"\n")) not in (b"\r\n", b"\n"):
                pass
            return bytes(body)
        if len(body) + size > MAX_ANSWER:
            raise BrokerGarbled(f"the broker's answer is over {MAX_ANSWER:,} bytes")
        body += await reader.readexactly(size)
        await reader.readuntil(b"\n")


async def _ask(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    request: bytes,
) -> tuple[int, dict[str, str], bytes]:
    writer.write(request)
    await writer.drain()
    try:
        status, headers = await _head(reader)
    except (asyncio.LimitOverrunError, ValueError) as error:
        raise BrokerGarbled(
            f"the broker's answer has a line over {MAX_HEAD_LINE:,} bytes"
        ) from error
    return status, headers, await _body(reader, headers)


def _request(method: str, path: str, payload: bytes | None, keep_alive: bool) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: box\r\n"
    if not keep_alive:
        head += "Connection: close\r\n"
    if payload is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
    return head.encode("ascii") + b"\r\n" + (payload or b"")


def _json(status: int, body: bytes) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BrokerGarbled(f"the broker answered {status} without JSON: {body[:200]!r}") from None


async def exchange(
    socket_path: str, method: str, path: str, payload: bytes | None
) -> tuple[int, Any]:
    """One request on a connection of its own: the broker's status and its JSON answer. A
    connection refused or cut off raises one of LOST; an answer that is not HTTP with JSON in
    it, BrokerGarbled."""
    reader, writer = await asyncio.open_unix_connection(socket_path, limit=MAX_HEAD_LINE)
    try:
        status, _, body = await _ask(
            reader, writer, _request(method, path, payload, keep_alive=False)
        )
    finally:
        writer.close()
    return status, _json(status, body)


Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


# How long a connection may sit idle before the worker closes it, as aiohttp's client did: a
# broker holding no connection of a worker that has gone quiet is free to count itself idle.
IDLE_SECONDS = 15.0


class Connections:
    """Connections to the broker kept open between requests (HTTP/1.1), as a worker's steps
    follow one another: one each for requests at the same time (a Droid worker's pending /ask
    beside its steps), each used again once its answer is read, and closed after IDLE_SECONDS
    unused. The same errors as `exchange`; a connection that failed is closed, never used
    again."""

    def __init__(self, socket_path: str, idle_seconds: float = IDLE_SECONDS) -> None:
        self._socket_path = socket_path
        self._idle_seconds = idle_seconds
        self._idle: list[tuple[Streams, asyncio.TimerHandle]] = []

    async def exchange(self, method: str, path: str, payload: bytes | None) -> tuple[int, Any]:
        streams = self._idle_one() or await asyncio.open_unix_connection(
            self._socket_path, limit=MAX_HEAD_LINE
        )
        reader, writer = streams
        try:
            status, headers, body = await _ask(
                reader, writer, _request(method, path, payload, keep_alive=True)
            )
        except BaseException:
            writer.close()
            raise
        if headers.get("connection", "").lower() == "close" or reader.at_eof():
            writer.close()
        else:
            timer = asyncio.get_running_loop().call_later(self._idle_seconds, self._expire, streams)
            self._idle.append((streams, timer))
        return status, _json(status, body)

    def _idle_one(self) -> Streams | None:
        """An idle connection the broker has not closed meanwhile (it does when it stops, or
        restarts after a crash): one it has is dropped rather than fail the next request."""
        while self._idle:
            (reader, writer), timer = self._idle.pop()
            timer.cancel()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return None

    def _expire(self, streams: Streams) -> None:
        for entry in self._idle:
            if entry[0] is streams:
                self._idle.remove(entry)
                streams[1].close()
                return

    def idle(self) -> int:
        """How many connections are open and unused."""
        return len(self._idle)

    def close(self) -> None:
        for (_, writer), timer in self._idle:
            timer.cancel()
            writer.close()
        self._idle.clear()


def error_words(answer: Any, status: int) -> str:
    """The broker's own words for a refusal, or its status when it gave none."""
    words = answer.get("error") if isinstance(answer, dict) else None
    return words if isinstance(words, str) else f"the broker answered {status}"


async def _once(socket_path: str, method: str, path: str, payload: bytes | None) -> Any:
    status, answer = await exchange(socket_path, method, path, payload)
    if status == MANAGER_AWAY:
        words = answer.get("error") if isinstance(answer, dict) else None
        raise _ManagerAway(words if isinstance(words, str) else "the box's manager is away")
    if status == DISK_FULL:
        raise _DiskFull(error_words(answer, status))
    if status >= 400:
        raise BrokerRefused(error_words(answer, status))
    return answer


async def request(socket_path: str, method: str, path: str, body: Any = None) -> Any:
    """The broker's JSON answer. A broker that went away, or whose manager is away, is asked
    again with the same body for up to broker_patience.PATIENCE_SECONDS: the keys in /call and
    /ask bodies are what make asking again safe (the relay sends nothing else). A broker that
    says the box's disk is full did nothing: it is asked again, as long as it takes, once a
    second (the owner may take hours to free space; Droid's tool call waits meanwhile, as a
    fake worker's step does)."""
    payload = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
    patience = Patience()
    told_full = False
    while True:
        try:
            return await _once(socket_path, method, path, payload)
        except _DiskFull as full:
            if not told_full:
                told_full = True
                log.warning("%s %s: %s Waiting for room.", method, path, full)
            await asyncio.sleep(FULL_PAUSE_SECONDS)
            # The broker was there: the time it may be away starts again.
            patience = Patience()
        except (*LOST, _ManagerAway) as error:
            words = str(error) or type(error).__name__
            if patience.tries == 0:
                log.warning(
                    "the broker did not answer %s %s (%s); trying again for up to %g s",
                    method,
                    path,
                    words,
                    patience.seconds,
                )
            if not await patience.pause():
                raise BrokerGone(
                    f"the box's broker did not answer at {socket_path} for "
                    f"{patience.seconds:g} s, over {patience.tries} tries ({words})"
                ) from None
