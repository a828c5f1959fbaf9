"""What one exchange with the upstream has seen, and its cost told to the manager
(`LogModelCost`, priced there: boxd.manager.model_requests) in jobs of their own, so a handler
cancelled mid-way still makes its report. What `message_start` said (the input and cache
tokens) is told as soon as it has passed, the rest once the reply ends; a reply that ends
without its final usage is charged what was reserved for it."""

import asyncio
import json
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from boxd.broker.manager_link import Manager
from boxd.broker.model.usage import JsonUsage, StreamUsage
from boxd.dbus import interface as api
from boxd.errors import BoxError, Problem

log = logging.getLogger(__name__)

# How long a reply's cost report is tried again on a full disk (doubling waits from 0.5 s).
REPORT_PATIENCE_SECONDS = 60


@dataclass
class Reply:
    """What one exchange with the upstream has seen, for its cost."""

    request: str
    status: int = 0
    # Whether the whole request went upstream: one that got no answer then may have been
    # worked on, and is charged the most it could cost.
    sent: bool = False
    usage: StreamUsage | JsonUsage | None = None
    started: dict[str, int] | None = None
    start_logged: "asyncio.Task[None] | None" = None


class CostReports:
    def __init__(self, manager: Manager) -> None:
        self._manager = manager
        # The reports on their way: the broker is busy while any is (boxd/broker/idle.py).
        self.pending: set[asyncio.Task[None]] = set()

    def start_seen(self, seen: Reply) -> None:
        """Logs what message_start said (the input and cache tokens, most of what a request
        costs) as soon as it has passed: a broker killed later leaves only the output to the
        reservation."""
        usage = seen.usage
        if seen.started is None and isinstance(usage, StreamUsage) and usage.at_start:
            seen.started = usage.at_start
            part = {"request": seen.request, "part": "start", "tokens": usage.at_start}
            seen.start_logged = self._log_soon(self._log_part(part))

    def end_seen(self, seen: Reply) -> None:
        """Logs the rest of the reply's cost, once what message_start said is logged."""
        self._log_soon(self._report_end(seen))

    async def delivered(self) -> None:
        """Until the reports on their way now have reached the manager (or given up). A reply
        that has ended holds its worst case in the record until its report arrives, and Droid
        sends its next request as soon as it has read the reply: begun before the report, that
        request would be counted beside a finished one and the owner asked about a budget the
        task is within."""
        if self.pending:
            await asyncio.wait(set(self.pending))

    def _log_soon(self, job: Awaitable[None]) -> "asyncio.Task[None]":
        """A report in a job of its own, so a handler cancelled mid-way still makes it."""
        task = asyncio.ensure_future(job)
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)
        return task

    async def _report_end(self, seen: Reply) -> None:
        if seen.start_logged is not None:
            await asyncio.wait({seen.start_logged})
        usage = seen.usage
        part = {
            "request": seen.request,
            "part": "end",
            "status": seen.status,
            "sent": seen.sent,
            # All the reply said: the manager charges what it did not charge yet.
            "tokens": usage.counts() if usage is not None else {},
            # The reply said its final usage: else it is charged the most it could cost.
            "complete": usage is not None and usage.final,
        }
        await self._log_part(part)

    async def _log_part(self, part: dict[str, Any]) -> None:
        """Tells the manager, trying again for a while on a full disk (the manager link waits
        for a manager that restarts): until it is told, the request holds its worst case."""
        delay = 0.5
        while True:
            try:
                await self._manager.call(api.LOG_MODEL_COST, json.dumps(part))
                return
            except BoxError as error:
                if error.problem != Problem.FULL or delay > REPORT_PATIENCE_SECONDS:
                    log.warning("could not log a model reply's cost: %s", error.message)
                    return
            await asyncio.sleep(delay)
            delay *= 2
