"""Slow, silent and crowding clients against a server the guard keeps
(boxd/doors/connection_guard.py, which serves the gateway and the model gateway with aiohttp) and
against a broker's own server (boxd/broker/http_server.py), which keeps the same bounds: each attack
runs against both, with the bounds shortened so it ends in a fraction of a second
(tests/vm/test_slow_clients.py attacks the real doors with the bounds of
boxd/doors/connection_limits.py, in a real box)."""

import asyncio
import json
import logging
import select
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from boxd.broker.http_request import Request
from boxd.broker.http_server import Answer, HttpServer, Routes, json_answer
from boxd.broker.model.messages_api import api_error_words
from boxd.doors.connection_guard import Guard, streams_body
from boxd.doors.connection_limits import Bounds, body_words, busy_words
from boxd.doors.json_errors import error
from tests.support.http_answers import status_of

HEAD = 0.5
BODY = 0.5
STALL = 0.5
CHECK = 0.05
# How much later than its bound a connection may end: a check, and the loop's own lateness.
SLACK = 0.5
BIG = 8 * 1024 * 1024


def bounds(connections: int = 100, turned_away: int = 8) -> Bounds:
    return Bounds(
        connections,
        head_seconds=HEAD,
        body_seconds=BODY,
        stall_seconds=STALL,
        check_seconds=CHECK,
        turned_away=turned_away,
        turned_away_seconds=1.0,
    )


def make_app(release: asyncio.Event, arrived: "asyncio.Queue[None]") -> web.Application:
    async def small(request: web.Request) -> web.StreamResponse:
        return web.json_response({"ok": True})

    async def big(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"x" * int(request.query.get("bytes", BIG)))

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(BIG // 65536):
            await response.write(b"x" * 65536)
        await response.write_eof()
        return response

    async def echo(request: web.Request) -> web.StreamResponse:
        return web.json_response({"length": len(await request.read())})

    async def wait(request: web.Request) -> web.StreamResponse:
        # Like an /ask waiting for the owner: long, and legitimately so.
        arrived.put_nowait(None)
        await release.wait()
        return web.json_response({"waited": True})

    @streams_body
    async def upload(request: web.Request) -> web.StreamResponse:
        # An upload's handler: it starts before its body is all in, and reads it as it comes.
        arrived.put_nowait(None)
        length = 0
        async for chunk in request.content.iter_chunked(65536):
            length += len(chunk)
        return web.json_response({"length": length})

    app = web.Application(client_max_size=2 * 1024 * 1024)
    app.router.add_put("/upload", upload)
    app.router.add_get("/small", small)
    app.router.add_get("/big", big)
    app.router.add_get("/stream", stream)
    app.router.add_post("/echo", echo)
    app.router.add_get("/wait", wait)
    return app


def make_routes(release: asyncio.Event, arrived: "asyncio.Queue[None]") -> Routes:
    """The app's routes, for a broker's server."""

    async def small(request: Request) -> Answer:
        return json_answer({"ok": True})

    async def big(request: Request) -> Answer:
        size = int(request.head.query.removeprefix("bytes=") or BIG)
        return Answer(200, b"x" * size)

    async def pieces() -> AsyncIterator[bytes]:
        for _ in range(BIG // 65536):
            yield b"x" * 65536

    async def stream(request: Request) -> Answer:
        return Answer(200, pieces=pieces())

    async def echo(request: Request) -> Answer:
        return json_answer({"length": len(request.body)})

    async def wait(request: Request) -> Answer:
        arrived.put_nowait(None)
        await release.wait()
        return json_answer({"waited": True})

    handlers = {"/small": small, "/big": big, "/stream": stream, "/wait": wait}
    return Routes(
        {
            **{path: {"GET": handler} for path, handler in handlers.items()},
            "/echo": {"POST": echo},
        },
        lambda failure: 400,
        "GET /small",
    )


Server = Guard | HttpServer
KIND = "aiohttp"


@pytest.fixture(autouse=True, params=["aiohttp", "broker"])
def kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs against both servers."""
    monkeypatch.setattr(sys.modules[__name__], "KIND", request.param)


class Served:
    def __init__(
        self, guard: Server, path: str, release: asyncio.Event, arrived: "asyncio.Queue[None]"
    ) -> None:
        self.guard = guard
        self.path = path
        self.release = release
        self.arrived = arrived

    async def waiting(self, count: int) -> None:
        """Once `count` requests wait in their handler."""
        for _ in range(count):
            await asyncio.wait_for(self.arrived.get(), 5)

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(self.path)

    async def ask(self, path: str) -> tuple[int, bytes]:
        reader, writer = await self.connect()
        writer.write(f"GET {path} HTTP/1.1\r\nHost: box\r\nConnection: close\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        return status_of(answer), answer

    async def until_open(self, count: int, within: float) -> float:
        """Seconds until the server holds `count` connections; fails after `within`."""
        started = time.monotonic()
        while self.guard.open_connections() != count:
            assert time.monotonic() - started < within, self.guard.open_connections()
            await asyncio.sleep(0.01)
        return time.monotonic() - started


@asynccontextmanager
async def served(tmp_path: Path, limits: Bounds | None = None) -> AsyncIterator[Served]:
    path = str(tmp_path / "door.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(4096)
    release = asyncio.Event()
    arrived: asyncio.Queue[None] = asyncio.Queue()
    guard: Server
    if KIND == "aiohttp":
        guard = Guard(make_app(release, arrived), limits or bounds(), error)
    else:
        guard = HttpServer(make_routes(release, arrived), limits or bounds())
    await guard.start([sock])
    try:
        yield Served(guard, path, release, arrived)
    finally:
        release.set()
        await guard.close()


async def closed_after(reader: asyncio.StreamReader, within: float) -> float:
    """Seconds until the server ends the connection, reading (and dropping) what it sends."""
    started = time.monotonic()
    async with asyncio.timeout(within):
        try:
            while await reader.read(65536):
                pass
        except ConnectionResetError:
            pass
    return time.monotonic() - started


async def test_a_connection_that_sends_nothing_is_closed_within_the_head_bound(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as door:
        reader, writer = await door.connect()
        took = await closed_after(reader, HEAD + SLACK + 1)
        writer.close()
    assert HEAD * 0.9 <= took <= HEAD + SLACK


async def test_a_head_sent_a_byte_at_a_time_is_closed_within_the_head_bound(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as door:
        reader, writer = await door.connect()
        started = time.monotonic()

        async def trickle() -> None:
            for byte in b"GET /small HTTP/1.1\r\nHost: box\r\nX-Slow: " + b"a" * 1000:
                writer.write(bytes([byte]))
                await asyncio.sleep(0.05)

        trickling = asyncio.create_task(trickle())
        try:
            await closed_after(reader, HEAD + SLACK + 1)
        finally:
            trickling.cancel()
        took = time.monotonic() - started
        writer.close()
    assert took <= HEAD + SLACK


async def test_a_body_that_never_finishes_gets_408_in_words_and_is_closed(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as door:
        reader, writer = await door.connect()
        started = time.monotonic()
        writer.write(b"POST /echo HTTP/1.1\r\nHost: box\r\nContent-Length: 1000000\r\n\r\n")
        writer.write(b"0123456789")
        answer = await asyncio.wait_for(reader.read(), BODY + SLACK + 1)
        took = time.monotonic() - started
        writer.close()
        assert door.guard.dropped["no whole body in time"] == 1
    assert status_of(answer) == 408
    assert json.loads(answer.partition(b"\r\n\r\n")[2]) == {"error": body_words(BODY)}
    assert BODY * 0.9 <= took <= BODY + SLACK


async def test_a_whole_body_is_read_for_the_handler(tmp_path: Path) -> None:
    async with served(tmp_path) as door:
        reader, writer = await door.connect()
        writer.write(b"POST /echo HTTP/1.1\r\nHost: box\r\nConnection: close\r\n")
        writer.write(b"Content-Length: 1000000\r\n\r\n" + b"y" * 1_000_000)
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert status_of(answer) == 200
    assert json.loads(answer.partition(b"\r\n\r\n")[2]) == {"length": 1_000_000}


async def test_a_streamed_body_reaches_its_handler_as_it_comes(tmp_path: Path) -> None:
    """A route marked streams_body (an upload) is not read whole first: its handler starts with
    the body still coming, and takes one larger than the app's size cap."""
    if KIND != "aiohttp":
        pytest.skip("the broker's server has no streamed routes")
    async with served(tmp_path) as door:
        reader, writer = await door.connect()
        size = 8 * 1024 * 1024
        writer.write(b"PUT /upload HTTP/1.1\r\nHost: box\r\nConnection: close\r\n")
        writer.write(f"Content-Length: {size}\r\n\r\n".encode() + b"y" * 1000)
        await door.waiting(1)
        writer.write(b"y" * (size - 1000))
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert status_of(answer) == 200
    assert json.loads(answer.partition(b"\r\n\r\n")[2]) == {"length": size}


async def test_a_client_that_reads_none_of_its_answer_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with served(tmp_path) as door:
        _, writer = await door.connect()
        # Written as it is made, like the gateway's long pages: the handler is mid-answer.
        writer.write(b"GET /stream HTTP/1.1\r\nHost: box\r\n\r\n")
        await door.until_open(1, 1)
        took = await door.until_open(0, STALL + SLACK + 1)
        writer.close()
        assert door.guard.dropped["its client read none of the answer"] == 1
    assert took <= STALL + SLACK
    # Counted, not a traceback each.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_client_reading_slowly_gets_its_whole_answer(tmp_path: Path) -> None:
    size = 1024 * 1024
    async with served(tmp_path) as door:
        reader, writer = await door.connect()
        writer.write(f"GET /big?bytes={size} HTTP/1.1\r\nHost: box\r\n\r\n".encode())
        await reader.readuntil(b"\r\n\r\n")
        got = 0
        started = time.monotonic()
        while got < size:
            # 64 KiB every tenth of a second: slow, and past the stall bound in all.
            got += len(await asyncio.wait_for(reader.read(65536), 5))
            await asyncio.sleep(0.1)
        writer.close()
        # Once all of it was out of the server's buffer, the head bound may have closed it.
        assert set(door.guard.dropped) <= {"no whole request head in time"}
    assert got == size
    assert time.monotonic() - started > STALL


async def test_a_request_that_waits_long_in_its_handler_is_never_timed(tmp_path: Path) -> None:
    async with served(tmp_path) as door:
        asking = asyncio.create_task(door.ask("/wait"))
        await door.until_open(1, 1)
        # Well past every bound, the request is still in hand and its connection open.
        await asyncio.sleep(3 * max(HEAD, BODY, STALL))
        assert door.guard.open_connections() == 1
        door.release.set()
        status, answer = await asking
    assert status == 200
    assert json.loads(answer.partition(b"\r\n\r\n")[2]) == {"waited": True}


async def test_an_idle_keep_alive_connection_is_closed_within_the_head_bound(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as door:
        reader, writer = await door.connect()
        writer.write(b"GET /small HTTP/1.1\r\nHost: box\r\n\r\n")
        await reader.readuntil(b'{"ok": true}')
        took = await closed_after(reader, HEAD + SLACK + 1)
        writer.close()
    assert took <= HEAD + SLACK


async def test_at_the_cap_a_newcomer_takes_the_place_of_the_oldest_idle_connection(
    tmp_path: Path,
) -> None:
    async with served(tmp_path, bounds(connections=3)) as door:
        idle = [await door.connect() for _ in range(3)]
        await door.until_open(3, 1)
        started = time.monotonic()
        status, _ = await door.ask("/small")
        took = time.monotonic() - started
        # The oldest was closed for it; the others still hang on until their head bound.
        await asyncio.wait_for(idle[0][0].read(), 1)
        assert not idle[1][0].at_eof()
        assert door.guard.dropped["taken over at the cap"] == 1
        for _, writer in idle:
            writer.close()
    assert status == 200
    assert took < HEAD


async def test_when_every_connection_is_in_a_request_the_next_gets_503_in_words(
    tmp_path: Path,
) -> None:
    async with served(tmp_path, bounds(connections=2)) as door:
        waiting = [asyncio.create_task(door.ask("/wait")) for _ in range(2)]
        await door.until_open(2, 1)
        await door.waiting(2)
        status, answer = await door.ask("/small")
        door.release.set()
        answered = [await task for task in waiting]
    assert status == 503
    assert b"Connection: close" in answer
    assert json.loads(answer.partition(b"\r\n\r\n")[2]) == {"error": busy_words(2)}
    assert [status for status, _ in answered] == [200, 200]


async def test_a_flood_beyond_the_cap_costs_no_descriptor_for_long(tmp_path: Path) -> None:
    async with served(tmp_path, bounds(connections=2, turned_away=2)) as door:
        waiting = [asyncio.create_task(door.ask("/wait")) for _ in range(2)]
        await door.waiting(2)
        flood = [await door.connect() for _ in range(20)]
        # Two are answered, the rest closed at once; none is kept past its moment.
        answers = [await asyncio.wait_for(reader.read(), 3) for reader, _ in flood]
        door.release.set()
        await asyncio.gather(*waiting)
        for _, writer in flood:
            writer.close()
        assert door.guard.dropped["turned away"] == 2
        assert door.guard.dropped["turned away unanswered"] == 18
    assert sum(status_of(answer) == 503 for answer in answers) == 2
    assert sum(answer == b"" for answer in answers) == 18


async def test_a_legitimate_client_is_answered_while_hundreds_of_idle_ones_hang_on(
    tmp_path: Path,
) -> None:
    async with served(tmp_path, bounds(connections=100)) as door:
        idle = [await door.connect() for _ in range(300)]
        started = time.monotonic()
        status, _ = await door.ask("/small")
        took = time.monotonic() - started
        assert door.guard.open_connections() <= 100
        for _, writer in idle:
            writer.close()
    assert status == 200
    assert took < HEAD


async def test_a_tcp_client_that_reads_none_of_its_answer_is_reset(tmp_path: Path) -> None:
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    release = asyncio.Event()
    guard = Guard(make_app(release, asyncio.Queue()), bounds(), error)
    await guard.start([listening])
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # A small window that is never opened: the answer stops in the server's buffer.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", port))
        client.sendall(b"GET /big HTTP/1.1\r\nHost: box\r\n\r\n")
        started = time.monotonic()
        poller = select.poll()
        poller.register(client, select.POLLERR | select.POLLHUP | select.POLLRDHUP)
        # Without reading a byte, the client sees its connection end: a reset, not a FIN stuck
        # behind the bytes it never took.
        while not poller.poll(0):
            assert time.monotonic() - started < STALL + SLACK, guard.dropped
            await asyncio.sleep(0.02)
        took = time.monotonic() - started
        assert guard.dropped["its client read none of the answer"] == 1
    finally:
        client.close()
        await guard.close()
    assert took <= STALL + SLACK


async def test_the_model_gateway_says_it_in_the_api_s_own_error_shape(tmp_path: Path) -> None:
    path = str(tmp_path / "model.sock")
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(path)
    listening.listen()
    guard = Guard(make_app(asyncio.Event(), asyncio.Queue()), bounds(), api_error_words)
    await guard.start([listening])
    try:
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: box\r\nContent-Length: 100\r\n\r\n{")
        answer = await asyncio.wait_for(reader.read(), BODY + SLACK + 1)
        writer.close()
    finally:
        await guard.close()
    assert status_of(answer) == 408
    assert json.loads(answer.partition(b"\r\n\r\n")[2]) == {
        "type": "error",
        "error": {"type": "api_error", "message": body_words(BODY)},
    }
    assert json.loads(guard.busy_reply.partition(b"\r\n\r\n")[2])["type"] == "error"


async def test_a_burst_accepted_at_once_makes_room_rather_than_being_turned_away(
    tmp_path: Path,
) -> None:
    async with served(tmp_path, bounds(connections=5)) as door:
        # Queued in the kernel before the server runs again: asyncio accepts them in one go,
        # before it has made any of them.
        burst = []
        for _ in range(50):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(door.path)
            burst.append(client)
        await door.until_open(5, 2)
        status, _ = await door.ask("/small")
        for client in burst:
            client.close()
        dropped = door.guard.dropped
    assert status == 200
    assert dropped["turned away"] + dropped["turned away unanswered"] == 0, dropped
    assert dropped["taken over at the cap"] == 46, dropped
