"""The broker over its Unix socket with the standard library only: one HTTP/1.0 request per
connection, JSON in and out, the answer read up to a cap.

The MCP relay talks to the broker through this rather than `broker_client` (aiohttp): Droid
waits for its MCP servers before its first model request, on every start and resume, and
importing aiohttp costs the relay several times what the rest of it does (bench/mcp_relay.py).
HTTP/1.0 keeps the client small: the broker answers with a length, or closes after the body.
"""

import asyncio
import json
import logging
from typing import Any

from boxd.errors import Problem
from boxd.strict_json import MAX_BODY
from boxd.workers.broker_patience import FULL_PAUSE_SECONDS, Patience

log = logging.getLogger(__name__)

# The broker's largest answer is a tool's output (1 MB as compact JSON) in its envelope; a
# request body may be 10 MB, and no answer of the broker's comes near that.
MAX_ANSWER = MAX_BODY
# A status line or header; the broker's are a few dozen characters.
MAX_HEAD_LINE = 8 * 1024
MAX_HEADERS = 100
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
_LOST = (ConnectionError, FileNotFoundError, asyncio.IncompleteReadError)


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = await reader.readuntil(b"\n")
    parts = status_line.decode("latin-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
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
        if not length.isdigit():
            raise BrokerGarbled(f"the broker's answer has a bad Content-Length: {length[:40]!r}")
        if int(length) > MAX_ANSWER:
            raise BrokerGarbled(f"the broker's answer is over {MAX_ANSWER:,} bytes")
        return await reader.readexactly(int(length))
    # No length: HTTP/1.0 says the body ends where the connection does.
    body = bytearray()
    while chunk := await reader.read(64 * 1024):
        body += chunk
        if len(body) > MAX_ANSWER:
            raise BrokerGarbled(f"the broker's answer is over {MAX_ANSWER:,} bytes")
    return bytes(body)


async def _once(socket_path: str, method: str, path: str, payload: bytes | None) -> Any:
    reader, writer = await asyncio.open_unix_connection(socket_path, limit=MAX_HEAD_LINE)
    try:
        head = f"{method} {path} HTTP/1.0\r\nHost: box\r\n"
        if payload is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        writer.write(head.encode("ascii") + b"\r\n" + (payload or b""))
        await writer.drain()
        try:
            status, headers = await _head(reader)
        except (asyncio.LimitOverrunError, ValueError) as error:
            raise BrokerGarbled(
                f"the broker's answer has a line over {MAX_HEAD_LINE:,} bytes"
            ) from error
        body = await _body(reader, headers)
    finally:
        writer.close()
    try:
        answer = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BrokerGarbled(f"the broker answered {status} without JSON: {body[:200]!r}") from None
    if status >= 400:
        words = answer.get("error") if isinstance(answer, dict) else None
        if status == MANAGER_AWAY:
            raise _ManagerAway(words if isinstance(words, str) else "the box's manager is away")
        if status == DISK_FULL:
            raise _DiskFull(words if isinstance(words, str) else "the box's disk is full")
        raise BrokerRefused(words if isinstance(words, str) else f"the broker answered {status}")
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
        except (*_LOST, _ManagerAway) as error:
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
