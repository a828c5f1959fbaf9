"""When a task's broker goes: once idle for BOX_BROKER_IDLE_MS it exits 0, and systemd starts it
again on the next connection to any of its sockets, which stay open in systemd all along and
queue what comes meanwhile. An idle task then costs boxd no process at all.

Idle means nothing in hand, for the whole time:
- no connection open on any of its doors (broker.sock, the egress proxies, the model gateway),
  counted from the moment it is accepted: a request being read or answered, an /ask or an
  over-budget /call waiting for the owner, a tunnel, a model reply streaming, a connection that
  sent nothing yet. Only a keep-alive connection at rest on an HTTP door (its last request
  answered whole, nothing of the next heard) does not count: the broker closes it as it exits,
  as each door's own HEAD_SECONDS rule would, and the worker opens another for its next request;
- no connection waiting in a socket's queue;
- no connection accepted since the last look, even one that came and went in between;
- nothing the broker still does by itself (`busy`): a call whose caller hung up, still running
  its tool or waiting for the owner.

The last look and the end of accepting happen in one step of the event loop: a connection is
either accepted by this broker, which is then not idle, or left in the queue for the next one.
So does the end of reading the keep-alive connections at rest: one whose next request is in the
kernel, not yet read, is in hand; the others are shut for reading in that step, so a request
sent after the last look is refused by the kernel at once (the worker asks again, and its
connection starts the next broker) rather than read by a broker that is going.
A task poking its broker keeps it up; one poking just after each exit starts it once per idle
period at most, never a crash loop (exit 0 is no failure to Restart=on-failure).
"""

import asyncio
import contextlib
import os
import select
import socket
import time
from collections.abc import Callable, Mapping, Sequence

from boxd.doors import idle_time
from boxd.doors.socket_activation import Door

IDLE_VARIABLE = "BOX_BROKER_IDLE_MS"
# How often the broker looks, as a share of the idle time, and at most.
LOOKS_PER_IDLE = 10
LONGEST_LOOK_SECONDS = 1.0


def idle_seconds(environ: Mapping[str, str] | None = None) -> float | None:
    """The idle time the broker's environment sets, in seconds; None when 0: never exit. A
    worker's keep-alive connection at rest does not count as something in hand, so a task whose
    agent thinks (its model reply streaming) or runs a tool keeps its broker; one that waits on
    something else (a long build, `sleep`) gives the memory back."""
    return idle_time.idle_seconds(IDLE_VARIABLE, "the broker", environ)


class IdleWatch:
    """Watches a broker's doors. `resting` gives the descriptors of keep-alive connections at
    rest (the HTTP doors' Guards'); `busy` says what the broker does without a connection."""

    def __init__(
        self,
        seconds: float,
        doors: Sequence[Door],
        *,
        resting: Callable[[], set[int]] = set,
        busy: Sequence[Callable[[], bool]] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seconds = seconds
        self.doors = list(doors)
        self._resting = resting
        self._busy = list(busy)
        self._clock = clock
        self.look_seconds = min(seconds / LOOKS_PER_IDLE, LONGEST_LOOK_SECONDS)

    def accepted(self) -> int:
        return sum(door.accepted for door in self.doors)

    def in_hand(self) -> bool:
        """Whether anything is in hand now (see the module's note)."""
        if any(busy() for busy in self._busy):
            return True
        if any(door.queued() for door in self.doors):
            return True
        open_connections = set[int]().union(*(door.open_connections() for door in self.doors))
        return bool(open_connections - self._quiet())

    def _quiet(self) -> set[int]:
        """The connections at rest with nothing of a next request waiting in the kernel."""
        return {fd for fd in self._resting() if not _readable(fd)}

    async def wait(self) -> None:
        """Returns once nothing was in hand for `seconds`, having stopped accepting on every
        door in the same step: what comes after stays queued for the next broker."""
        loop = asyncio.get_running_loop()
        seen = self.accepted()
        since = self._clock()
        while True:
            await asyncio.sleep(self.look_seconds)
            now = self._clock()
            accepted = self.accepted()
            if accepted != seen or self.in_hand():
                seen, since = accepted, now
                continue
            if now - since >= self.seconds:
                for door in self.doors:
                    loop.remove_reader(door)
                for fd in self._quiet():
                    _shut_for_reading(fd)
                return


def _readable(fd: int) -> bool:
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    return bool(poll.poll(0))


def _shut_for_reading(fd: int) -> None:
    """Nothing more is read from the connection: on a Unix socket its client's next write fails
    at once (EPIPE); the broker's server then sees its end and closes it."""
    with socket.socket(fileno=os.dup(fd)) as connection, contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RD)  # unless it is gone already
