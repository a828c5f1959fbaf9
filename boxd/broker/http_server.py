"""The broker's HTTP server: its routes (boxd/broker/app.py) on the task's broker socket, with
slow and silent clients bounded as on every door (boxd/doors/connection_limits.py).

The broker is started on every task's start and on the first request after it exited idle, and
one runs for every running task: aiohttp's server cost each time to import (its client side
comes with it) and memory (docs/performance.md, "The broker's import"). The broker's clients
are its own task's worker and relay, one
request at a time with a small JSON body, so this is a small server on asyncio's transports:
requests read by boxd/broker/http_request.py, one at a time on each connection, answered whole
or (GET /task) in chunks as they come, every refusal `{"error": "..."}`.

A handler is not cancelled when its client hangs up: what it began (a step, a call's run)
is finished and recorded, as the broker's API promises.
"""

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, cast

from boxd.broker.http_request import Head, Refusal, Request, RequestReader
from boxd.doors.connection_limits import Bounds, body_words, busy_words
from boxd.doors.door_cap import Cap, Dropped, Listening
from boxd.errors import BoxError

log = logging.getLogger(__name__)

# What a connection may have sent ahead of the request being answered before it is no longer
# read (a client sending requests without waiting for answers): the rest waits in the kernel.
READ_AHEAD = 64 * 1024
# How long a stopping broker gives the requests in hand to be answered before it cuts them.
STOP_SECONDS = 5.0
STOPPING = Refusal(503, "the broker is stopping; nothing of this request was done: send it again")
# Every connection's reads land here, and are copied out at once (asyncio calls get_buffer,
# reads, then buffer_updated, in one turn). A plain Protocol has each read made into a new
# 256 KiB bytes that is then shrunk: an mmap, an mremap and a munmap a request, each CPU of
# the broker's for nothing (docs/performance.md, "6 December: the bench's clients as the
# workers' own"). Small, as every broker holds it for good (a hundred brokers hold a
# hundred): a request is some hundreds of bytes, and a large body takes more reads.
_READS = memoryview(bytearray(16 * 1024))


@dataclass
class Answer:
    status: int
    body: bytes = b""
    # An answer sent in chunks as they come, after its head: a failure cuts it off.
    pieces: AsyncIterator[bytes] | None = None


def json_answer(value: Any, status: int = 200) -> Answer:
    return Answer(status, json.dumps(value).encode())


def error_answer(words: str, status: int) -> Answer:
    return json_answer({"error": words}, status)


Handler = Callable[[Request], Awaitable[Answer]]


@dataclass
class Routes:
    """What a server answers: handlers by path then method. `status_of` gives a BoxError's
    status; `served` tells a caller who asked for something unknown what there is."""

    handlers: dict[str, dict[str, Handler]]
    status_of: Callable[[BoxError], int]
    served: str
    # Run as the server stops, before its connections are closed.
    on_close: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


def _head_bytes(status: int, fields: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
    lines += [f"{name}: {value}" for name, value in fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def whole_answer(
    answer: Answer, keep_alive: bool, extra: tuple[tuple[str, str], ...] = ()
) -> bytes:
    fields = [
        ("Content-Type", "application/json; charset=utf-8"),
        ("Content-Length", str(len(answer.body))),
        *extra,
    ]
    if not keep_alive:
        fields.append(("Connection", "close"))
    return _head_bytes(answer.status, fields) + answer.body


class _Connection(asyncio.BufferedProtocol):
    def __init__(self, listener: "_Listener", now: float) -> None:
        self.listener = listener
        self.server = listener.server
        self.transport: asyncio.Transport | None = None
        self.reader = RequestReader()
        self.opened = now
        # Since when no request has been in hand: the head rule counts from here.
        self.waiting_since = now
        self.head_at: float | None = None
        # The request being answered, from its whole body to its answer's last byte.
        self.answering: asyncio.Task[None] | None = None
        self.answered = 0
        self.doomed = False
        self.ended: str | None = None
        self.buffered = 0
        self.stalled_since: float | None = None
        self._writable: asyncio.Future[None] | None = None
        # Its client said it sends nothing more: closed once the answer in hand is sent.
        self._close_after = False

    @property
    def reading_body(self) -> bool:
        return self.reader.head is not None and self.answering is None

    @property
    def busy(self) -> bool:
        return self.answering is not None

    @property
    def resting(self) -> bool:
        """A keep-alive connection at rest: its last request answered whole, nothing heard of
        another since."""
        transport = self.transport
        return (
            self.answered > 0
            and self.answering is None
            and self.reader.between_requests
            and transport is not None
            and not transport.is_closing()
            and transport.get_write_buffer_size() == 0
        )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self.doomed:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.forget(self)
        # A result, not an error: nobody may be waiting on it, and an error never read is
        # logged (a line per connection a task hangs up on). drain() sees the transport gone.
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    async def drain(self) -> None:
        if self._writable is not None:
            await asyncio.shield(self._writable)
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the client hung up")

    def get_buffer(self, sizehint: int) -> memoryview:
        return _READS

    def buffer_updated(self, nbytes: int) -> None:
        self.reader.feed(_READS[:nbytes])
        self._advance()

    def eof_received(self) -> bool | None:
        # Its client sends nothing more; the answer in hand is still sent, then it closes.
        if self.answering is None:
            return False
        self._close_after = True
        return True

    def _advance(self) -> None:
        """Reads what came while no request is being answered."""
        transport = self.transport
        while self.answering is None and transport is not None and not transport.is_closing():
            try:
                got = self.reader.next()
            except Refusal as refusal:
                self._refuse(refusal)
                return
            if got is None:
                # A head or a body under way: each is bounded by its reader (LONGEST_HEAD,
                # MAX_BODY).
                return
            if isinstance(got, Head):
                self.head_at = asyncio.get_running_loop().time()
                if got.expects_continue:
                    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                continue
            self.head_at = None
            if self.server.stopping:
                # Begun now, it would run past on_close and be cut off halfway by the end.
                self._refuse(STOPPING)
                return
            self.answering = asyncio.get_running_loop().create_task(self._answer(got))
            self.server.answering.add(self.answering)
        if (
            self.answering is not None
            and transport is not None
            and len(self.reader.buffer) > READ_AHEAD
        ):
            transport.pause_reading()

    def _refuse(self, refusal: Refusal) -> None:
        assert self.transport is not None
        self.transport.write(whole_answer(error_answer(refusal.words, refusal.status), False))
        self.transport.close()

    async def _answer(self, request: Request) -> None:
        keep_alive = request.head.keep_alive
        try:
            answer = await self.server.answer(request)
            if self._close_after or self.server.stopping:
                keep_alive = False
            await self._send(answer, keep_alive, request.head.http11)
            if keep_alive:
                # The next request is read once this answer is on its way: a client sending
                # requests and reading no answer would otherwise have every answer held here.
                await self.drain()
        except ConnectionResetError:
            # The client hung up, or the answer was cut off on purpose: nothing more to send.
            keep_alive = False
            if self.transport is not None:
                self.transport.abort()
        except Exception:
            log.exception(
                "the broker failed to send its answer to %s %s", request.method, request.path
            )
            keep_alive = False
            if self.transport is not None:
                self.transport.abort()
        finally:
            self.server.answering.discard(cast("asyncio.Task[None]", asyncio.current_task()))
            self.answering = None
            self.answered += 1
            self.waiting_since = asyncio.get_running_loop().time()
            self.listener.waited(self)
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if not keep_alive:
            transport.close()
            return
        transport.resume_reading()
        self._advance()

    async def _send(self, answer: Answer, keep_alive: bool, http11: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client hung up")
        if answer.pieces is None:
            transport.write(whole_answer(answer, keep_alive))
            return
        # HTTP/1.0 reads no chunks: its answer ends where the connection does (it is never
        # kept alive), so a cut-off answer looks whole to it. Clients that must tell the two
        # apart, as boxd's own do, send HTTP/1.1.
        chunked = http11
        fields = [("Content-Type", "application/json; charset=utf-8")]
        if chunked:
            fields.append(("Transfer-Encoding", "chunked"))
        if not keep_alive:
            fields.append(("Connection", "close"))
        transport.write(_head_bytes(answer.status, fields))
        async for piece in answer.pieces:
            if piece:
                await self.drain()
                transport.write(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
        if chunked:
            transport.write(b"0\r\n\r\n")

    def drop(self, why: str) -> None:
        self.listener.drop(self, why)


class _Listener(Cap[_Connection]):
    """One listening socket's connections, and its cap."""

    def __init__(self, server: "HttpServer") -> None:
        super().__init__(server.bounds, server.dropped, server.busy_reply)
        self.server = server

    def __call__(self) -> asyncio.BaseProtocol:
        """A protocol for a connection just accepted (asyncio's protocol factory)."""
        now = asyncio.get_running_loop().time()
        return self.admit(now) or self.add(_Connection(self, now))


class HttpServer:
    """Serves `routes` on listening sockets within `bounds`."""

    def __init__(self, routes: Routes, bounds: Bounds) -> None:
        self.routes = routes
        self.bounds = bounds
        self.dropped = Dropped()
        self.answering: set[asyncio.Task[None]] = set()
        self._listening: Listening[_Listener] = Listening(bounds, self.check)
        # Set once close() begins: no request is begun after it.
        self.stopping = False
        self.busy_reply = whole_answer(
            error_answer(busy_words(bounds.connections), 503), False, (("Retry-After", "1"),)
        )

    async def start(self, sockets: list[socket.socket]) -> None:
        await self._listening.start(sockets, lambda: _Listener(self))

    async def close(self) -> None:
        """Stops accepting, runs the routes' on_close, gives the requests in hand STOP_SECONDS
        to be answered, then closes every connection."""
        self.stopping = True
        self._listening.stop()
        for hook in self.routes.on_close:
            await hook()
        if self.answering:
            _, late = await asyncio.wait(set(self.answering), timeout=STOP_SECONDS)
            for job in late:
                job.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        for listener in self._listening.listeners:
            for connection in list(listener.open):
                connection.drop("the broker stopped")

    async def answer(self, request: Request) -> Answer:
        """The routes' answer to a whole request, every error in words."""
        routes = self.routes
        methods = routes.handlers.get(request.path)
        if methods is None:
            return error_answer(
                f"no such request: {request.method} {request.path[:200]}; {routes.served}", 404
            )
        handler = methods.get(request.method)
        if handler is None:
            return error_answer(f"{request.path} does not take {request.method}", 405)
        try:
            return await handler(request)
        except BoxError as failure:
            return error_answer(failure.message, routes.status_of(failure))
        except ConnectionResetError:
            raise
        except Exception:
            log.exception("the broker failed to answer %s %s", request.method, request.path)
            return error_answer(
                "the broker failed to answer this request; its journal says why", 500
            )

    def resting(self) -> set[int]:
        """The descriptors of the keep-alive connections at rest (Listening.resting)."""
        return self._listening.resting()

    def open_connections(self) -> int:
        return self._listening.open_connections()

    def check(self, now: float) -> None:
        """Ends what overstayed its bound."""
        for listener in self._listening.listeners:
            for connection in list(listener.open):
                self._check_one(connection, now)
            listener.forget_turned_away(now)
        self.dropped.report(now)

    def _check_one(self, connection: _Connection, now: float) -> None:
        bounds = self.bounds
        transport = connection.transport
        if transport is None:
            # Accepted but never made (its accept failed): not a connection at all.
            if now - connection.opened > bounds.head_seconds:
                connection.listener.forget(connection)
            return
        size = transport.get_write_buffer_size()
        if size == 0:
            connection.stalled_since = None
        elif size < connection.buffered or connection.stalled_since is None:
            connection.stalled_since = now
        connection.buffered = size
        if connection.stalled_since is not None:
            # An answer going out: the head clock starts once it is out.
            connection.waiting_since = now
            if now - connection.stalled_since >= bounds.stall_seconds:
                connection.drop("its client read none of the answer")
            return
        if connection.busy:
            return
        if connection.reading_body:
            assert connection.head_at is not None
            if now - connection.head_at >= bounds.body_seconds:
                late = error_answer(body_words(bounds.body_seconds), 408)
                transport.write(whole_answer(late, False))
                # Aborted if even this cannot be sent: a close would wait for its client to read
                # it, for good, and no rule watches a connection no longer counted.
                connection.drop("no whole body in time")
        elif now - connection.waiting_since >= bounds.head_seconds:
            connection.drop("no whole request head in time")
