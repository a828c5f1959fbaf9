"""Serving an aiohttp app on listening sockets with slow and silent clients bounded in time and
in number (the bounds: boxd/doors/connection_limits.py).

aiohttp alone does not do it. Its keep-alive timer closes a connection that never sends a
head (in its recent versions), but nothing times a body that never finishes, nor an answer its
client never reads; and closing a connection whose client reads nothing waits for the bytes to
leave, which they never do, so the descriptor stays. It also takes every connection offered. So
each connection goes through a thin protocol of ours, which keeps its transport to abort it, a
check runs every CHECK_SECONDS, and two middlewares tell it which connections are in the middle
of a request (the outermost) and which are still sending a body (the innermost).
"""

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import cast

from aiohttp import web
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestHandler

from boxd.doors.connection_limits import Bounds, body_words, busy_words
from boxd.doors.door_cap import Cap, Dropped, Listening
from boxd.doors.json_errors import error
from boxd.doors.socket_activation import passed_sockets
from boxd.doors.stopping import until_stopped

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Marks a route's handler that reads its own body as it comes (an upload streamed on to the
# manager, boxd/web/uploads.py): its body is not read whole first, which would hold it all in
# memory and cap it at the JSON routes' size. What bounds a sender that stalls is its reader's.
_STREAMS_BODY = "_boxd_streams_body"


def streams_body(handler: Handler) -> Handler:
    setattr(handler, _STREAMS_BODY, True)
    return handler


Answer = Callable[[str, int], web.Response]


class _Connection(asyncio.Protocol):
    """Passes everything between the transport and aiohttp's handler, and keeps what the
    guard needs to know of the connection."""

    def __init__(self, listener: "_Listener", inner: RequestHandler, now: float) -> None:
        self.listener = listener
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.opened = now
        # Since when no request has been in hand: the head rule counts from here. Set through
        # wait_from, which keeps the listener's connections in this order.
        self.waiting_since = now
        # Taken over at the cap before asyncio made it: ended as soon as it is.
        self.doomed = False
        # Why the guard ended it, once it did.
        self.ended: str | None = None
        # Requests being handled (the outermost middleware), and whether one is still reading
        # its body (the innermost): a connection in the middle of a request is never timed by
        # the head rule, nor taken over at the cap, unless its body is what it waits for.
        self.handling = 0
        self.reading_body = False
        self.buffered = 0
        self.stalled_since: float | None = None
        # A request was answered and nothing of another has come since: a keep-alive connection
        # at rest, which an idle broker may close (boxd/broker/idle.py). Not yet on a new one.
        self.rested = False

    @property
    def busy(self) -> bool:
        return self.handling > 0 and not self.reading_body

    @property
    def resting(self) -> bool:
        transport = self.transport
        return (
            self.rested
            and self.handling == 0
            and transport is not None
            and not transport.is_closing()
            and transport.get_write_buffer_size() == 0
        )

    def wait_from(self, now: float) -> None:
        self.waiting_since = now
        self.listener.waited(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self.doomed:
            self.transport.abort()
            return
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.forget(self)
        if not self.doomed:
            self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.rested = False
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        self.inner.eof_received()
        return None

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def drop(self, why: str) -> None:
        self.listener.drop(self, why)


class _Listener(Cap[_Connection]):
    """One listening socket's connections, and its cap."""

    def __init__(self, guard: "Guard") -> None:
        super().__init__(guard.bounds, guard.dropped, guard.busy_reply)
        self.guard = guard

    def forget(self, connection: _Connection) -> None:
        super().forget(connection)
        self.guard.connections.pop(connection.inner, None)

    def __call__(self) -> asyncio.BaseProtocol:
        """A protocol for a connection just accepted (asyncio's protocol factory)."""
        guard = self.guard
        assert guard.server is not None  # started
        now = asyncio.get_running_loop().time()
        turned = self.admit(now)
        if turned is not None:
            return turned
        connection = self.add(_Connection(self, guard.server(), now))
        guard.connections[connection.inner] = connection
        return connection


class Guard:
    """Serves `app` on listening sockets within `bounds`. Errors it answers itself (408 for a
    body too slow, 503 at the cap) come from `answer(words, status)`, in the app's own shape."""

    def __init__(
        self,
        app: web.Application,
        bounds: Bounds,
        answer: Answer = error,
        read_body: Callable[[web.Request], Awaitable[object]] | None = None,
    ) -> None:
        self.app = app
        # How a request's body is read whole before the app sees it: aiohttp's read(), which
        # keeps it for the handler's own; or the app's, which keeps it its own way (the model
        # gateway's, in one buffer of the size the request says, where aiohttp's joins its
        # chunks into a second copy).
        self.read_body = read_body or (lambda request: request.read())
        self.bounds = bounds
        self.answer = answer
        # Why connections were dropped, and how many: logged at most once a minute.
        self.dropped = Dropped()
        self.connections: dict[RequestHandler, _Connection] = {}
        self.server: web.Server | None = None
        self._runner: web.AppRunner | None = None
        self._listening: Listening[_Listener] = Listening(bounds, self.check)
        self.busy_reply = _raw_reply(answer(busy_words(bounds.connections), 503))
        # Outermost: a request counts as in hand from the moment aiohttp hands it over.
        app.middlewares.insert(0, _in_hand(self))
        # Innermost: the body is read after the app's own middlewares checked the caller, and
        # inside its error middleware, which says what a body over the size cap is.
        app.middlewares.append(_whole_body(self))

    async def start(self, sockets: list[socket.socket]) -> None:
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            # aiohttp's own timer for a connection that sends nothing, or idles between requests.
            keepalive_timeout=self.bounds.head_seconds,
        )
        await self._runner.setup()
        self.server = self._runner.server
        await self._listening.start(sockets, lambda: _Listener(self))

    async def close(self) -> None:
        self._listening.stop()
        if self._runner is not None:
            await self._runner.cleanup()

    def open_connections(self) -> int:
        return self._listening.open_connections()

    def resting(self) -> set[int]:
        """The descriptors of the keep-alive connections at rest (Listening.resting)."""
        return self._listening.resting()

    def check(self, now: float) -> None:
        """Drops what overstayed its bound."""
        self._drop_overstayed(now)
        self.dropped.report(now)

    def _drop_overstayed(self, now: float) -> None:
        bounds = self.bounds
        for listener in self._listening.listeners:
            for connection in list(listener.open):
                transport = connection.transport
                if transport is None:
                    # Accepted but never made (its accept failed): not a connection at all.
                    if now - connection.opened > bounds.head_seconds:
                        listener.forget(connection)
                    continue
                size = transport.get_write_buffer_size()
                if size == 0:
                    connection.stalled_since = None
                else:
                    # An answer going out (aiohttp writes the last of it after the handler
                    # returned): the head clock starts once it is out; until then it is the
                    # stall rule's.
                    connection.wait_from(now)
                    if size < connection.buffered or connection.stalled_since is None:
                        connection.stalled_since = now
                connection.buffered = size
                if (
                    connection.stalled_since is not None
                    and now - connection.stalled_since >= bounds.stall_seconds
                ):
                    connection.drop("its client read none of the answer")
                elif connection.handling == 0 and now - connection.waiting_since >= (
                    bounds.head_seconds
                ):
                    connection.drop("no whole request head in time")
            listener.forget_turned_away(now)


def _in_hand(guard: Guard) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        connection = guard.connections.get(request.protocol)
        if connection is None:
            return await handler(request)
        connection.handling += 1
        try:
            return await handler(request)
        except ConnectionResetError:
            if connection.ended is None:
                raise
            # The guard ended it mid-answer, and counted it: no traceback in the journal for
            # each (aiohttp's own would be one per connection), and nothing left to send.
            return web.Response(status=500)
        finally:
            connection.handling -= 1
            if connection.handling == 0:
                connection.rested = True
                connection.wait_from(asyncio.get_running_loop().time())

    return middleware


def _whole_body(guard: Guard) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        connection = guard.connections.get(request.protocol)
        streamed = getattr(request.match_info.handler, _STREAMS_BODY, False)
        if connection is not None and request.body_exists and not streamed:
            connection.reading_body = True
            try:
                # Kept: the handler's own read gets it at once.
                async with asyncio.timeout(guard.bounds.body_seconds):
                    await guard.read_body(request)
            except TimeoutError:
                guard.dropped["no whole body in time"] += 1
                late = guard.answer(body_words(guard.bounds.body_seconds), 408)
                late.force_close()
                await late.prepare(request)
                await late.write_eof()
                # Closed once the answer is out, not after aiohttp's wait for the rest of the
                # body; a client that does not read the answer either is the stall rule's.
                if connection.transport is not None:
                    connection.transport.close()
                return late
            finally:
                connection.reading_body = False
        return await handler(request)

    return middleware


def _raw_reply(response: web.Response) -> bytes:
    """The bytes of a whole HTTP/1.1 answer, written before a request is read."""
    body = response.body
    assert isinstance(body, bytes)  # json_response's is
    head = (
        f"HTTP/1.1 {response.status} {response.reason}\r\n"
        f"Content-Type: {response.content_type}; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Retry-After: 1\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


async def serve(app: web.Application, unit: str, connections: int) -> None:
    """Serves the app on every socket systemd passed, each with at most `connections` open at
    once, until stopped."""
    sockets: list[socket.socket] = [s for group in passed_sockets(unit).values() for s in group]
    guard = Guard(app, Bounds(connections))
    await guard.start(sockets)
    await until_stopped()
    await guard.close()
