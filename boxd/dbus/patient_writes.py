"""A workaround for dbus-fast (5.2.0, and python-dbus-next before it): when the socket to the
bus is full, `send` raises BlockingIOError (EAGAIN), and its writer takes that for a broken
connection and drops it (python-dbus-next issue #153). A few large messages in a row (1 MB
steps, a page of a long answer) filled the manager's socket and cut boxd off the bus.

Here the writer's socket answers "nothing sent yet" instead, which its writer already handles:
it waits until the socket is writable and carries on.
"""

import logging
import socket
from typing import Any

from dbus_fast.aio import MessageBus

log = logging.getLogger(__name__)


class PatientSocket:
    """The bus socket, with a full buffer read as 0 bytes sent rather than an error."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def send(self, data: Any, *flags: int) -> int:
        try:
            return self._sock.send(data, *flags)
        except BlockingIOError:
            return 0

    def sendmsg(self, *args: Any) -> int:
        try:
            return self._sock.sendmsg(*args)
        except BlockingIOError:
            return 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def patient(bus: MessageBus) -> MessageBus:
    """The connected bus, its writer made to wait for a full socket instead of hanging up."""
    writer = getattr(bus, "_writer", None)
    sock = getattr(writer, "sock", None)
    if writer is None or not isinstance(sock, socket.socket):
        # A dbus-fast whose writer looks different: it may have fixed this, or moved it.
        log.warning("dbus-fast's writer is not as expected; large messages may drop the bus")
        return bus
    writer.sock = PatientSocket(sock)
    return bus
