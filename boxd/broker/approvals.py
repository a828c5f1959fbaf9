"""Waiting for the owner's answer: the manager's WaitApproval, a call it answers once the
approval is answered or the time asked for has passed. The answer comes back to the caller
alone, as a method's reply: no other broker, nor anyone else on the bus, hears it (a signal
would reach whoever may receive boxd's signals, and every broker's user once could).

A broker waits on at most MAX_WAITING approvals at once (the bus lets a connection have 128
calls unanswered); a wait beyond them waits for a place, within its own time."""

import asyncio
import time
from typing import Any

from boxd.broker.manager_link import Manager
from boxd.dbus import interface as api
from boxd.wire.approval import ApprovalState

MAX_WAITING = 64


class ApprovalWaiter:
    def __init__(self, manager: Manager) -> None:
        self._manager = manager
        self._places = asyncio.Semaphore(MAX_WAITING)

    async def wait(self, approval: dict[str, Any], seconds: float) -> str:
        """The approval's state once answered, or `pending` when `seconds` pass first."""
        if approval["state"] != ApprovalState.PENDING:
            return str(approval["state"])
        deadline = time.monotonic() + seconds
        try:
            await asyncio.wait_for(self._places.acquire(), seconds)
        except TimeoutError:
            return ApprovalState.PENDING.value
        try:
            # The manager's answer after boxd restarted too: ManagerLink asks again.
            left = max(0, round((deadline - time.monotonic()) * 1000))
            answer = await self._manager.call(api.WAIT_APPROVAL, str(approval["id"]), str(left))
        finally:
            self._places.release()
        return str(answer["state"])
