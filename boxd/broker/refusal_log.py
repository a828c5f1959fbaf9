"""Logging the egress proxies' refusals as `net.refused` events, through the manager.

The proxy answers its 403 without waiting for the log: while boxd restarts, the manager's log
may take up to a minute and a half to answer (see manager_link), and the task must not hang for
that. A refusal still in flight when the broker stops gets a few seconds to be logged.
"""

import asyncio
import json
import logging

from boxd.broker.manager_link import Manager
from boxd.errors import BoxError

log = logging.getLogger(__name__)

CLOSING_SECONDS = 5.0


class RefusalLog:
    def __init__(self, manager: Manager) -> None:
        self._manager = manager
        self._pending: set[asyncio.Task[None]] = set()

    async def __call__(self, target: str, reason: str) -> None:
        job = asyncio.create_task(self._send(target, reason))
        self._pending.add(job)
        job.add_done_callback(self._pending.discard)

    async def _send(self, target: str, reason: str) -> None:
        try:
            await self._manager.call("LogRefusal", json.dumps({"target": target, "reason": reason}))
        except BoxError as error:
            # The task was refused either way; only the log line is lost.
            log.warning("could not log the refusal of %s: %s", target, error.message)

    async def close(self) -> None:
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=CLOSING_SECONDS)
        for job in self._pending:
            job.cancel()
