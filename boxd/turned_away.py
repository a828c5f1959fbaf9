"""What every door does with a connection it cannot take, and with one it must end while an
answer is still unsent: one place for the aiohttp doors (boxd/connection_guard.py) and the
broker's own (boxd/broker/http_server.py)."""

import asyncio
import socket
import struct
from collections.abc import Callable
from typing import cast


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


def reset_on_close(transport: asyncio.BaseTransport) -> None:
    """A TCP connection closed with unsent bytes would linger in the kernel, its end (FIN) queued
    behind bytes the client never takes, for as long as the kernel probes its shut window: a
    reset ends it at once, on both sides. (A Unix socket's peer sees the end at once anyway.)"""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
