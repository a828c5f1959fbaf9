"""A door's cap on its connections: which one makes room for a newcomer, what a connection it
cannot take is told, and how one is ended while an answer is still unsent; and the door's
listening sockets, each with its cap, checked every `check_seconds`. One place for the aiohttp
doors (boxd/doors/connection_guard.py) and the broker's own (boxd/broker/http_server.py)."""

import asyncio
import logging
import socket
import struct
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar, cast

from boxd.doors.connection_limits import LISTEN_BACKLOG, Bounds
from boxd.doors.paced_log import LOG_SECONDS

log = logging.getLogger(__name__)


class Dropped(Counter[str]):
    """Why a server's connections were ended by their bounds, and how many: a crowd of slow
    clients is worth a line in the journal at most once a minute, not a line each."""

    def __init__(self) -> None:
        super().__init__()
        self._logged: Counter[str] = Counter()
        self._logged_at = 0.0

    def report(self, now: float) -> None:
        """Logs what was ended since the last line, if a minute has passed since it."""
        if self != self._logged and now - self._logged_at >= LOG_SECONDS:
            since = self - self._logged
            log.info(
                "connections ended by their bounds since the last such line: %s",
                ", ".join(f"{count} {why}" for why, count in since.items()),
            )
            self._logged = Counter(self)
            self._logged_at = now


class TurnedAway(asyncio.Protocol):
    """A connection over the cap: answered `reply` (or not at all when None) and closed once
    its client hung up or `seconds` passed."""

    def __init__(
        self,
        reply: bytes | None,
        seconds: float,
        now: float,
        gone: Callable[["TurnedAway"], None],
    ) -> None:
        self.reply = reply
        self.seconds = seconds
        self.opened = now
        self._gone = gone
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)
        if self.reply is None:
            stream.abort()
            return
        stream.write(self.reply)
        if stream.can_write_eof():
            stream.write_eof()
        self._timer = asyncio.get_running_loop().call_later(self.seconds, stream.abort)

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone(self)
        if self._timer is not None:
            self._timer.cancel()

    def data_received(self, data: bytes) -> None:
        pass  # what it asked is not read: it was answered already

    def eof_received(self) -> bool | None:
        return False  # it hung up: close


def end(transport: asyncio.Transport | None) -> bool:
    """Ends a connection: closed when nothing of an answer waits in our buffer (what the kernel
    holds still reaches the client, then the end), aborted when something does, as a close would
    wait for bytes its client does not read. False when it is not made yet."""
    if transport is None:
        return False
    if transport.get_write_buffer_size():
        _reset_on_close(transport)
        transport.abort()
    else:
        transport.close()
    return True


def _reset_on_close(transport: asyncio.BaseTransport) -> None:
    """A TCP connection closed with unsent bytes would linger in the kernel, its end (FIN) queued
    behind bytes the client never takes, for as long as the kernel probes its shut window: a
    reset ends it at once, on both sides. (A Unix socket's peer sees the end at once anyway.)"""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class Capped(Protocol):
    """A connection as the cap sees it."""

    transport: asyncio.Transport | None
    # Why it was ended, once it was; and whether it is to be ended as soon as it is made.
    ended: str | None
    doomed: bool

    @property
    def busy(self) -> bool:
        """In the middle of a request: never taken over to make room."""
        ...

    @property
    def resting(self) -> bool:
        """A keep-alive connection at rest: its last answer out whole, nothing heard since."""
        ...

    def drop(self, why: str) -> None: ...


C = TypeVar("C", bound=Capped)


class Cap(Generic[C]):
    """One listening socket's connections, oldest wait first, within `bounds.connections`."""

    def __init__(self, bounds: Bounds, dropped: Dropped, busy_reply: bytes) -> None:
        self.bounds = bounds
        # Why connections were ended, and how many: the server logs it at most once a minute.
        self.dropped = dropped
        self.busy_reply = busy_reply
        # Oldest wait first: at the cap the first that is not busy makes room.
        self.open: OrderedDict[C, None] = OrderedDict()
        self.turned_away: set[TurnedAway] = set()

    def __call__(self) -> asyncio.BaseProtocol:
        """A protocol for a connection just accepted (asyncio's protocol factory): the door's
        own, or TurnedAway; each door says how it makes its connections."""
        raise NotImplementedError

    def forget(self, connection: C) -> None:
        self.open.pop(connection, None)

    def drop(self, connection: C, why: str) -> None:
        """Ends `connection` (`end`), counted with why; one not made yet, as soon as it is."""
        self.forget(connection)
        self.dropped[why] += 1
        connection.ended = why
        connection.doomed = not end(connection.transport)

    def waited(self, connection: C) -> None:
        """`connection` waits afresh (its answer went out): the last to make room."""
        if connection in self.open:
            self.open.move_to_end(connection)

    def admit(self, now: float) -> TurnedAway | None:
        """Makes room for a connection just accepted, or says how it is turned away."""
        if len(self.open) < self.bounds.connections:
            return None
        # Connections asyncio has not made yet count as waiting too: a burst is accepted whole
        # before any of it is made.
        oldest = next((c for c in self.open if not c.busy), None)
        if oldest is not None:
            oldest.drop("taken over at the cap")
            return None
        answered = len(self.turned_away) < self.bounds.turned_away
        self.dropped["turned away" if answered else "turned away unanswered"] += 1
        turned = TurnedAway(
            self.busy_reply if answered else None,
            self.bounds.turned_away_seconds,
            now,
            self.turned_away.discard,
        )
        if answered:
            self.turned_away.add(turned)
        return turned

    def add(self, connection: C) -> C:
        self.open[connection] = None
        return connection

    def forget_turned_away(self, now: float) -> None:
        """Forgets those whose connection was never made, or whose timer went with its loop."""
        bounds = self.bounds
        for turned in list(self.turned_away):
            if now - turned.opened > 2 * bounds.turned_away_seconds + bounds.check_seconds:
                self.turned_away.discard(turned)


L = TypeVar("L", bound=Cap[Any])


class Listening(Generic[L]):
    """A door's listening sockets, each with its cap (`L`, also the socket's protocol factory),
    and `check(now)` run every `bounds.check_seconds` to end what overstayed its bounds."""

    def __init__(self, bounds: Bounds, check: Callable[[float], None]) -> None:
        self.bounds = bounds
        self.listeners: list[L] = []
        self._check = check
        self._servers: list[asyncio.Server] = []
        self._checking: asyncio.Task[None] | None = None

    async def start(self, sockets: list[socket.socket], listener: Callable[[], L]) -> None:
        loop = asyncio.get_running_loop()
        for sock in sockets:
            sock.setblocking(False)
            made = listener()
            self.listeners.append(made)
            self._servers.append(await loop.create_server(made, sock=sock, backlog=LISTEN_BACKLOG))
        self._checking = asyncio.create_task(self._check_often())

    def stop(self) -> None:
        """Stops accepting and checking; the connections open stay, for their server to end."""
        if self._checking is not None:
            self._checking.cancel()
        for server in self._servers:
            server.close()

    def open_connections(self) -> int:
        return sum(len(listener.open) for listener in self.listeners)

    def resting(self) -> set[int]:
        """The descriptors of the keep-alive connections at rest: their last request answered
        whole, nothing of another heard since."""
        return {
            connection.transport.get_extra_info("socket").fileno()
            for listener in self.listeners
            for connection in listener.open
            if connection.resting and connection.transport is not None
        }

    async def _check_often(self) -> None:
        while True:
            await asyncio.sleep(self.bounds.check_seconds)
            self._check(asyncio.get_running_loop().time())
