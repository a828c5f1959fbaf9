"""The manager's doctor: the checks run once as it starts and again on each `CheckMachine`,
and, while a blocking one fails, no task starts (fail closed).

Every start of a worker asks `refuse_if_failing` first: a new task is refused in the failed
checks' words (a 503), a queued one stays queued, a spare is not made, a worker that must
start again after a reboot does not. Until the first checks have answered, those who ask wait
for them (about 0.2 s, once); the manager's own start does not. Checks that pass again after
a fix let the queued tasks start.

The owner may ask for the checks (`CheckMachine`) as often as they like, each asking makes
trial mounts, namespaces and units: at most one run is under way at a time, and runs are
MIN_INTERVAL_SECONDS apart. An asking within that time of the last run's end is answered that
run's findings, with their age; one made while a run is under way is answered the next run,
which begins that time after it.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from boxd.errors import Problem, die
from boxd.manager.doctor.time_limit import RUN_SECONDS, TimeUp, did_not_answer, within
from boxd.wire.doctor import MIN_INTERVAL_SECONDS, OWNER_TOLD, Finding, failed, refusal

log = logging.getLogger(__name__)


class Doctor:
    def __init__(
        self,
        check: Callable[[], Awaitable[list[Finding]]],
        cleared: Callable[[], None],
        limit: float = RUN_SECONDS,
        min_interval: float = MIN_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._check = check
        self._min_interval = min_interval
        self._clock = clock
        self._sleep = sleep
        # When the last run ended (by `clock`); None before the first has.
        self._ended: float | None = None
        # How long a run may take, whatever `check` does: every start waits for the first.
        self._limit = limit
        # Told when the checks pass after they had failed.
        self._cleared = cleared
        self._running: asyncio.Task[list[Finding]] | None = None
        # The run whose checks have begun, and the one to run after it for those who asked
        # since: what a run under way finds may be of before a fix they just made.
        self._begun: asyncio.Task[list[Finding]] | None = None
        self._next: asyncio.Task[list[Finding]] | None = None
        # The last checks' findings; None until the first have answered.
        self.findings: list[Finding] | None = None

    def begin(self) -> None:
        """Starts the checks, beside whatever the caller does next."""
        self._run_soon()

    def _run_soon(self) -> "asyncio.Task[list[Finding]]":
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._run())
        return self._running

    async def check_again(self) -> list[Finding]:
        """Runs the checks anew and answers their findings: a run not begun yet is joined, one
        whose checks began is waited for, then one more run, shared by all who asked meanwhile
        and begun MIN_INTERVAL_SECONDS after it ended (at most one runs at a time, however many
        ask); within that time of the last run's end, its findings (`age` says how old)."""
        running = self._running
        if running is not None and not running.done() and self._begun is running:
            if self._next is None:
                self._next = asyncio.create_task(self._run_after(running))
            return await asyncio.shield(self._next)
        idle = running is None or running.done()
        if idle and self.findings is not None and self.age() < self._min_interval:
            return self.findings
        return await asyncio.shield(self._run_soon())

    def age(self) -> float:
        """How long ago the last findings were found, in seconds; 0 before any were."""
        return 0.0 if self._ended is None else max(0.0, self._clock() - self._ended)

    async def _run_after(self, running: "asyncio.Task[list[Finding]]") -> list[Finding]:
        await asyncio.wait({running})
        wait = self._min_interval - self.age()
        if wait > 0:
            await self._sleep(wait)
        self._next = None
        return await self._run_soon()

    async def _run(self) -> list[Finding]:
        self._begun = asyncio.current_task()
        # Those who asked before the first checks answered waited for them: only a refusal
        # that was answered makes work to take up once the checks pass.
        before = refusal(self.findings) if self.findings is not None else None
        began = time.monotonic()
        try:
            findings = await within(self._limit, self._check())
        except TimeUp:
            findings = [
                did_not_answer(
                    "the checks",
                    self._limit,
                    "the journal of boxd.service (journalctl -u boxd), and the processes it "
                    "started that hang (systemctl status boxd)",
                    blocks=True,
                )
            ]
        except Exception as error:
            log.exception("boxd could not check this machine")
            findings = [
                failed(
                    "the checks",
                    f"boxd could not check this machine: {error}.",
                    "run boxd doctor as root; the journal of boxd.service says more.",
                    blocks=True,
                )
            ]
        self.findings = findings
        self._ended = self._clock()
        log.info("boxd doctor: checked this machine in %.2f s", time.monotonic() - began)
        for finding in findings:
            if not finding.ok:
                level = logging.ERROR if finding.blocks else logging.WARNING
                log.log(level, "boxd doctor: %s", finding.words)
        if refusal(findings) is not None:
            log.error("boxd starts no task until the failed checks above pass")
        elif before is not None:
            self._cleared()
        return findings

    async def refusal(self) -> str | None:
        """Why no task may start now, in the failed checks' words; None when they passed."""
        findings = self.findings
        if findings is None:
            # The first run, joined wherever it is: any answer is newer than none.
            findings = await asyncio.shield(self._run_soon())
        return refusal(findings)

    async def refuse_if_failing(self, *, to_owner: bool) -> None:
        """A 503 while a check that blocks fails: in its words to the owner, who may be told
        what the machine lacks; else in words that name none (OWNER_TOLD)."""
        words = await self.refusal()
        if words is not None:
            die(Problem.UNAVAILABLE, words if to_owner else OWNER_TOLD)
