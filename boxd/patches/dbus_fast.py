"""The patches of dbus-fast's writer (`MessageBus._writer`, a private `_MessageWriter`), which
both take over part of what it does with the bus's socket.

patient(bus)
    what:     the writer's `sock` becomes a PatientSocket, which reads a full socket (EAGAIN)
              as 0 bytes sent, which the writer already handles: it waits until the socket is
              writable and carries on.
    why:      dbus-fast takes BlockingIOError for a broken connection and drops the bus
              (python-dbus-next issue #153): a few large messages in a row (1 MB steps, a page
              of a long answer) cut the manager off the bus.
    for:      dbus-fast 5.2 (pyproject.toml pins >=5.2,<5.3: docs/decisions.md says why).
    tests:    tests/patches/test_patient_writes.py; its shape: tests/patches/test_shapes.py.

gathered(bus)
    what:     the writer's `schedule_write` becomes GatheredWrites.schedule_write: the messages
              made in one turn of the event loop wait in dbus-fast's own queue, and one
              sendmsg(2) takes them all at the end of the turn, in order. What does not fit in
              the socket waits until it is writable, as dbus-fast's writer does.
    why:      a step makes three messages (the reply, PropertiesChanged, the Event signal) and
              a group commit answers many steps in one turn; dbus-fast writes each with a
              send(2) of its own, and each wakes dbus-daemon.
    for:      dbus-fast 5.2, as above.
    tests:    tests/patches/test_gathered_writes.py; its shape: tests/patches/test_shapes.py.

Either patch, finding a writer not as expected, logs a warning and leaves the bus as it is.
"""

import array
import asyncio
import logging
import socket
from collections import deque
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


# Messages in one sendmsg(2): well under IOV_MAX (1024).
BATCH = 256


class GatheredWrites:
    """Takes over the writes of a connected bus's dbus-fast writer."""

    def __init__(self, bus: MessageBus, writer: Any) -> None:
        self._bus = bus
        self._writer = writer
        self._loop: asyncio.AbstractEventLoop = writer.loop
        # dbus-fast's queue of (marshalled message, fds, future), which its buffer_message fills.
        self._messages: deque[tuple[bytearray, list[int] | None, asyncio.Future[None] | None]]
        self._messages = writer.messages
        # How much of the first message in the queue was written already.
        self._offset = 0
        # A write at the end of this turn is queued, or the socket is awaited.
        self._queued = False
        self._awaiting_socket = False

    def schedule_write(self, msg: Any = None, future: "asyncio.Future[None] | None" = None) -> None:
        """What dbus-fast's MessageBus.send calls: the message joins the queue, written at the
        end of this turn of the loop."""
        if msg is not None:
            self._writer.buffer_message(msg, future)
        # Before the bus said Hello, dbus-fast holds messages back; it asks again once it has.
        if not self._bus.unique_name or self._queued or self._awaiting_socket:
            return
        self._queued = True
        self._loop.call_soon(self._write)

    def _write(self) -> None:
        self._queued = False
        sock = self._writer.sock
        try:
            while self._messages:
                sent = self._send(sock)
                if not self._consume(sent):
                    # The socket is full: the rest waits until it takes more.
                    if not self._awaiting_socket:
                        self._awaiting_socket = True
                        self._loop.add_writer(self._writer.fd, self._on_writable)
                    return
        except Exception as error:
            if self._messages:
                _, _, future = self._messages[0]
                if future is not None and not future.done():
                    if self._bus._user_disconnect:
                        future.set_result(None)
                    else:
                        future.set_exception(error)
            self._bus._finalize(error)
            return
        if self._awaiting_socket:
            self._awaiting_socket = False
            self._loop.remove_writer(self._writer.fd)

    def _on_writable(self) -> None:
        self._write()

    def _send(self, sock: Any) -> int:
        """One sendmsg(2) of the queue's head: up to BATCH messages, or one that passes file
        descriptors alone (the descriptors go with its first byte)."""
        first, fds, _ = self._messages[0]
        if fds and self._writer.negotiate_unix_fd and self._offset == 0:
            rights = (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))
            return int(sock.sendmsg([first], [rights]))
        views = [memoryview(first)[self._offset :]]
        for number, (buffer, more_fds, _) in enumerate(self._messages):
            if number == 0:
                continue
            if number >= BATCH or (more_fds and self._writer.negotiate_unix_fd):
                break
            views.append(memoryview(buffer))
        return int(sock.sendmsg(views))

    def _consume(self, sent: int) -> bool:
        """Drops the messages `sent` bytes finished and answers their futures; whether the
        socket took everything it was given (False: it is full for now)."""
        if sent == 0:
            return False
        while sent and self._messages:
            buffer, _, future = self._messages[0]
            left = len(buffer) - self._offset
            if sent < left:
                self._offset += sent
                return False
            sent -= left
            self._offset = 0
            self._messages.popleft()
            if future is not None and not future.done():
                future.set_result(None)
        return True


def gathered(bus: MessageBus) -> MessageBus:
    """The connected bus, writing the messages of each turn of the loop together."""
    writer = getattr(bus, "_writer", None)
    if writer is None or not all(
        hasattr(writer, name)
        for name in ("messages", "buffer_message", "sock", "loop", "fd", "negotiate_unix_fd")
    ):
        log.warning("dbus-fast's writer is not as expected; each message is written alone")
        return bus
    # dbus-fast's own writer may still wait for the socket (it does after Hello): it writes what
    # it holds now and stops waiting, or, if the socket will not take it yet, keeps the writes.
    writer.write_callback()
    if getattr(writer, "buf", None) is not None:
        log.warning("the bus's socket is full at the start; each message is written alone")
        return bus
    gathering = GatheredWrites(bus, writer)
    writer.schedule_write = gathering.schedule_write
    return bus
