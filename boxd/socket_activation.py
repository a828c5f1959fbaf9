"""The listening sockets systemd passed in, and serving an aiohttp app on them until stopped,
with slow and silent clients bounded (boxd/connection_guard.py)."""

import socket

from aiohttp import web
from systemd import daemon

from boxd.connection_guard import Bounds, Guard
from boxd.errors import Problem, die
from boxd.stopping import until_stopped


def passed_sockets(unit: str) -> dict[str, list[socket.socket]]:
    """The sockets systemd passed, by their FileDescriptorName (a socket unit's own name unless
    it sets one)."""
    named: dict[str, list[socket.socket]] = {}
    for fd, name in daemon.listen_fds_with_names().items():
        named.setdefault(name, []).append(socket.socket(fileno=fd))
    if not named:
        die(Problem.FAILED, f"this service is started by {unit}, which passes its socket")
    return named


async def serve(
    app: web.Application,
    unit: str,
    connections: int,
    sockets: list[socket.socket] | None = None,
) -> None:
    """Serves the app on `sockets`, or on every socket systemd passed, each with at most
    `connections` open at once."""
    if sockets is None:
        sockets = [s for group in passed_sockets(unit).values() for s in group]
    guard = Guard(app, Bounds(connections))
    await guard.start(sockets)
    await until_stopped()
    await guard.close()
