"""The listening sockets systemd passed in."""

import select
import socket
import weakref
from typing import Any

from systemd import daemon

from boxd.errors import Problem, die


class Door(socket.socket):
    """A listening socket systemd passed, which knows the connections it accepted while they are
    open, from the moment they are accepted: asyncio's servers accept through it, so this holds
    whatever serves the socket (an HTTP server or a proxy)."""

    def __init__(self, fileno: int) -> None:
        super().__init__(fileno=fileno)
        # Connections accepted so far: a change says one came, even if it went before a look.
        self.accepted = 0
        self._open: weakref.WeakSet[socket.socket] = weakref.WeakSet()

    def accept(self) -> tuple[socket.socket, Any]:
        connection, address = super().accept()
        self.accepted += 1
        self._open.add(connection)
        return connection, address

    def open_connections(self) -> set[int]:
        """The descriptors of the connections it accepted that are still open."""
        return {fd for fd in (c.fileno() for c in list(self._open)) if fd != -1}

    def queued(self) -> bool:
        """Whether a connection waits in the kernel's queue to be accepted."""
        poll = select.poll()
        poll.register(self.fileno(), select.POLLIN)
        return bool(poll.poll(0))


def passed_sockets(unit: str) -> dict[str, list[Door]]:
    """The sockets systemd passed, by their FileDescriptorName (a socket unit's own name unless
    it sets one)."""
    named: dict[str, list[Door]] = {}
    for fd, name in daemon.listen_fds_with_names().items():
        named.setdefault(name, []).append(Door(fd))
    if not named:
        die(Problem.FAILED, f"this service is started by {unit}, which passes its socket")
    return named
