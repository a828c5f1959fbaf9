"""The broker's calls to the manager, which keeps the log.

While boxd restarts its name is briefly unowned; a worker's step must not fail for that, so
calls wait for the manager to come back, for a while.
"""

import asyncio
from typing import Any, Protocol

from dbus_fast.aio import MessageBus

from boxd.dbus.client import BoxClient
from boxd.dbus.interface import BROKER, LOG_STEP, Method
from boxd.errors import BoxError, Problem

_PATIENCE_SECONDS = 90.0
# Calls with no key, which logged twice would say twice what happened once.
_SENT_ONCE = frozenset({LOG_STEP})


class Manager(Protocol):
    """The manager's log as the broker reaches it: ManagerLink over D-Bus, or a test's own."""

    async def call(self, method: Method, *args: str) -> Any: ...


class Waiter(Protocol):
    """Waits for the owner's answer to an approval: ApprovalWaiter, or a test's own."""

    async def wait(self, approval: dict[str, Any], seconds: float) -> str: ...


class ManagerLink:
    def __init__(self, bus: MessageBus, task_id: str) -> None:
        self._client = BoxClient(bus, BROKER)
        self.task_id = task_id

    async def call(self, method: Method, *args: str) -> Any:
        """Calls `method` on the broker's interface for this task; the task's id goes first."""
        waited = 0.0
        delay = 0.05
        while True:
            try:
                return await self._client.call(method, self.task_id, *args)
            except BoxError as error:
                if error.problem != Problem.UNAVAILABLE or waited >= _PATIENCE_SECONDS:
                    raise
                if method in _SENT_ONCE:
                    # A manager that died after the call reached it (NoReply) may have logged
                    # it: the worker looks in GET /task before it sends it again.
                    raise
            await asyncio.sleep(delay)
            waited += delay
            delay = min(delay * 2, 1.0)
