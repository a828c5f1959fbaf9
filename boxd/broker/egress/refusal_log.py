"""Logging the egress proxies' refusals as `net.refused` events, through the manager.

A task can be refused thousands of times a second, and each event is a D-Bus call, a row in
the store and a journal line in the manager, which every task and the owner share. So refusals
are coalesced here: at most one event per host per WINDOW, carrying the number of refusals it
stands for. A host's first refusal is logged at once; the ones that follow within the window
are counted and logged together when it ends, so the counts add up to every refusal. At most
MAX_HOSTS hosts are kept apart at a time; refusals of further hosts share one event until some
go quiet. One call to the manager is in flight at a time, so a slow manager makes the counts
grow, not the calls.

The proxy answers its 403 without waiting for the log: while boxd restarts, the manager's log
may take up to a minute and a half to answer (see manager_link), and the task must not hang for
that. When the broker stops, the counts still held get a few seconds to be logged.
"""

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from boxd.broker.manager_link import Manager
from boxd.dbus import interface as api
from boxd.errors import BoxError

log = logging.getLogger(__name__)

CLOSING_SECONDS = 5.0

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

# The key of the refusals of hosts past MAX_HOSTS; no host is named this (a target has a port).
_OTHERS = ""


@dataclass
class _Held:
    """A host's refusals not yet logged: the first one's words, and how many there were."""

    target: str = ""
    reason: str = ""
    count: int = 0
    logged_at: float = float("-inf")


def host_of(target: str) -> str:
    """ "example.com:443" -> "example.com", "[2001:db8::1]:443" -> "[2001:db8::1]"."""
    return target.rpartition(":")[0] or target


class RefusalLog:
    WINDOW = 1.0
    MAX_HOSTS = 32

    def __init__(
        self, manager: Manager, *, clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep
    ) -> None:
        self._manager = manager
        self._clock = clock
        self._sleep = sleep
        self._held: dict[str, _Held] = {}
        self._wake = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._closing = False

    async def __call__(self, target: str, reason: str) -> None:
        self._forget_quiet_hosts()
        key = host_of(target)
        if key not in self._held and len(self._held) >= self.MAX_HOSTS:
            key = _OTHERS
        held = self._held.setdefault(key, _Held())
        if held.count == 0:
            held.target = f"{target} and other hosts" if key == _OTHERS else target
            held.reason = reason
        held.count += 1
        self._wake.set()
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_all())

    def _forget_quiet_hosts(self) -> None:
        now = self._clock()
        for key, held in list(self._held.items()):
            if held.count == 0 and now - held.logged_at >= self.WINDOW:
                del self._held[key]

    def _due(self) -> _Held | None:
        now = self._clock()
        for held in self._held.values():
            if held.count and (self._closing or now - held.logged_at >= self.WINDOW):
                return held
        return None

    async def _send_all(self) -> None:
        while True:
            held = self._due()
            if held is not None:
                target, reason, count = held.target, held.reason, held.count
                held.count = 0
                held.logged_at = self._clock()
                await self._send(target, reason, count)
                continue
            if self._closing:
                return
            self._wake.clear()
            waiting = [h.logged_at + self.WINDOW for h in self._held.values() if h.count]
            await self._wait(min(waiting) - self._clock() if waiting else None)

    async def _wait(self, seconds: float | None) -> None:
        """Until a refusal comes in or `seconds` pass, whichever is first."""
        woken = asyncio.ensure_future(self._wake.wait())
        if seconds is None:
            await woken
            return
        slept = asyncio.ensure_future(self._sleep(max(seconds, 0.0)))
        try:
            await asyncio.wait({woken, slept}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            slept.cancel()

    async def _send(self, target: str, reason: str, count: int) -> None:
        refusal = {"target": target, "reason": reason, "count": count}
        try:
            await self._manager.call(api.LOG_REFUSAL, json.dumps(refusal))
        except BoxError as error:
            # The task was refused either way; only the log line is lost.
            log.warning("could not log %d refusal(s) of %s: %s", count, target, error.message)

    async def close(self) -> None:
        """Logs what is still held, for at most CLOSING_SECONDS."""
        self._closing = True
        self._wake.set()
        if self._sender is None:
            return
        done, _ = await asyncio.wait({self._sender}, timeout=CLOSING_SECONDS)
        if not done:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
