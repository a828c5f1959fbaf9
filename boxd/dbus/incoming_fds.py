"""The file descriptors that come in on a bus connection that negotiates them.

dbus-fast (5.2) puts the descriptors a message carries in `message.unix_fds` and never closes
them: on a connection that negotiates descriptors, any local user can send it signals (the
system bus lets anyone) or calls with descriptors attached, and each one stays open in the
receiving process until it runs out. So the first message handler on such a connection is
this guard's: it closes the descriptors of every message, unless the message is

- a call the server will serve of a method declared to take one (`takes`, set by
  boxd.dbus.server), which then owns them and closes them once its handler returns; or
- the reply to a call made here that asked for one (`awaiting`), whose descriptors go to
  the caller's Awaited, which closes whatever its caller did not take.
"""

import logging
import os
from collections.abc import Callable
from typing import Any

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

log = logging.getLogger(__name__)


def close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            log.warning("file descriptor %d was already closed", fd)


class Awaited:
    """The descriptors of the reply to one call, held until its caller takes one."""

    def __init__(self, guard: "IncomingFds", serial: int) -> None:
        self._guard = guard
        self._serial = serial
        self.fds: list[int] = []

    def take(self, index: Any) -> int:
        """The descriptor at `index` of the reply, now the caller's to close."""
        if not isinstance(index, int) or not 0 <= index < len(self.fds):
            raise IndexError(f"the reply names descriptor {index!r} of {len(self.fds)}")
        return self.fds.pop(index)

    def __enter__(self) -> "Awaited":
        return self

    def __exit__(self, *_: object) -> None:
        """Closes what was not taken; a reply still to come is closed on arrival."""
        self._guard._awaited.pop(self._serial, None)
        close_all(self.fds)
        self.fds = []


class IncomingFds:
    def __init__(self, bus: MessageBus) -> None:
        self._awaited: dict[int, Awaited] = {}
        # Whether a call is one the server serves with its descriptor (boxd.dbus.server).
        self.takes: Callable[[Message], bool] = lambda _: False
        # First, so no handler after it sees a descriptor it would have to close.
        bus.add_message_handler(self._on_message)

    def awaiting(self, serial: int) -> Awaited:
        """Keeps the descriptors of the reply to the call of this serial for its caller, who
        uses the Awaited as a context: leaving it closes what was not taken."""
        awaited = Awaited(self, serial)
        self._awaited[serial] = awaited
        return awaited

    def _on_message(self, message: Message) -> None:
        fds = message.unix_fds
        if not fds:
            return
        kind = message.message_type
        if kind == MessageType.METHOD_CALL and self.takes(message):
            return
        awaited = None
        if kind in (MessageType.METHOD_RETURN, MessageType.ERROR):
            # The bus daemon passes on a reply only from the connection the call went to.
            awaited = self._awaited.pop(message.reply_serial, None)
        if awaited is not None:
            awaited.fds.extend(fds)
        else:
            close_all(fds)
        message.unix_fds = []


_GUARDS: dict[int, IncomingFds] = {}


def guard(bus: MessageBus) -> IncomingFds:
    """The guard of a bus connected with `negotiate_unix_fd`, installed before any other
    handler is (boxd.dbus.client.connect_system_bus, the manager's start)."""
    found = _GUARDS.get(id(bus))
    if found is None:
        raise RuntimeError("this bus connection does not take file descriptors")
    return found


def guarded(bus: MessageBus) -> MessageBus:
    """The bus, its incoming descriptors guarded; called right after it connects. A process
    holds its connections for its life, so the table is never cleared."""
    _GUARDS[id(bus)] = IncomingFds(bus)
    return bus
