"""Whether Droid is installed, being installed or could not be, and what that means for queued
Droid tasks. When boxd starts and the pinned binary is missing, it starts
boxd-droid-install.service and follows the unit to its end; a failed install is tried again the
next time boxd starts, never in a loop."""

import asyncio
import logging
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from boxd.droid.installer import failure_reason
from boxd.droid.release import VERSION, droid_binary
from boxd.manager.units.last_words import last_words
from boxd.manager.units.systemd import CLD_EXITED, CLD_KILLED, Systemd, SystemdError, UnitStatus
from boxd.wire.models.task import Task
from boxd.wire.models.task_request import Worker

log = logging.getLogger(__name__)

INSTALL_UNIT = "boxd-droid-install.service"
TRY_AGAIN = "boxd tries again the next time it starts (systemctl restart boxd)."


class Phase(StrEnum):
    INSTALLED = "installed"
    INSTALLING = "installing"
    FAILED = "failed"


@dataclass(frozen=True)
class DroidState:
    phase: Phase
    # Why the install failed, in plain words; None unless it did.
    why: str | None = None

    @property
    def task_error(self) -> str | None:
        """What a Droid task that cannot run says, or None while it may run or wait."""
        if self.phase != Phase.FAILED:
            return None
        return f"Droid could not be installed: {self.why}. {TRY_AGAIN}"

    def public(self) -> dict[str, Any]:
        installed = self.phase == Phase.INSTALLED
        return {
            "version": VERSION,
            "installed": installed,
            "installing": self.phase == Phase.INSTALLING,
            "error": self.task_error,
        }


def sort_queue(
    queued: Iterable[Task], state: DroidState, paused: bool = False
) -> tuple[list[Task], list[Task]]:
    """The queued tasks that may take a place now, and the Droid tasks to fail at once. While
    Droid installs its tasks are neither: they wait without holding a place. While the owner
    has paused the agents no task is either: every one stays queued, as the seed says, and a
    Droid task whose install failed is refused once the agents resume."""
    may_start: list[Task] = []
    refused: list[Task] = []
    if paused:
        return may_start, refused
    for task in queued:
        if task.worker != Worker.DROID or state.phase == Phase.INSTALLED:
            may_start.append(task)
        elif state.phase == Phase.FAILED:
            refused.append(task)
    return may_start, refused


def unit_failure(status: UnitStatus, said: str | None) -> str:
    """Why the install unit failed, from its last line or else from how it ended."""
    reason = failure_reason(said) if said else None
    if reason:
        return reason
    if status.result == "timeout":
        return f"{INSTALL_UNIT} ran past its time limit (TimeoutStartSec) and systemd stopped it"
    if status.result == "signal" or status.main_code == CLD_KILLED:
        try:
            name = signal.Signals(status.main_status).name
        except ValueError:
            name = f"signal {status.main_status}"
        return f"{INSTALL_UNIT} was killed by {name}"
    if status.result == "exit-code" and status.main_code == CLD_EXITED:
        return (
            f"{INSTALL_UNIT} exited with status {status.main_status} "
            f"(journalctl -u {INSTALL_UNIT} says why)"
        )
    if status.active_state == "inactive" and status.result == "success":
        return f"{INSTALL_UNIT} was stopped before it finished"
    return f"{INSTALL_UNIT} failed: systemd says {status.result}"


class DroidInstall:
    """The install's state for this run of boxd; `changed` is called when it settles."""

    def __init__(
        self,
        systemd: Systemd,
        changed: Callable[[], None],
        binary: Path | None = None,
    ) -> None:
        self.systemd = systemd
        self.changed = changed
        self.binary = binary or droid_binary()
        # Until begin(): a Droid task created meanwhile waits, and is refused by nothing.
        self.state = DroidState(Phase.INSTALLED if self.binary.is_file() else Phase.INSTALLING)
        self._following = False
        self._background: set[asyncio.Task[None]] = set()

    async def begin(self) -> None:
        """Starts the install unless the binary is there. Returns once the unit's start job is
        queued, so boxd's start never waits for a download."""
        if await asyncio.to_thread(self.binary.is_file):
            self.state = DroidState(Phase.INSTALLED)
            return
        log.info("Droid %s is not installed; starting %s", VERSION, INSTALL_UNIT)
        try:
            # The unit writes only there (ReadWritePaths), which must exist for it to start.
            await asyncio.to_thread(
                self.binary.parent.parent.mkdir, mode=0o755, parents=True, exist_ok=True
            )
            await self.systemd.reset_failed(INSTALL_UNIT)
            self.systemd.watch(INSTALL_UNIT, self._check_soon)
            await self.systemd.start_unit(INSTALL_UNIT)
        except (SystemdError, OSError) as error:
            self.systemd.unwatch(INSTALL_UNIT)
            self._settle(DroidState(Phase.FAILED, f"{INSTALL_UNIT} could not be started: {error}"))
            return
        # Until the start job is queued, the unit may still read as its last run ended.
        self._following = True
        self._check_soon()

    def _check_soon(self) -> None:
        if not self._following:
            return
        job = asyncio.create_task(self._check())
        self._background.add(job)
        job.add_done_callback(self._background.discard)

    async def _check(self) -> None:
        try:
            status = await self.systemd.status(INSTALL_UNIT)
            if not self._following:
                return
            if status is None:
                self._settle(
                    DroidState(Phase.FAILED, f"{INSTALL_UNIT} was gone before boxd saw it end")
                )
                return
            if not status.finished:
                return
            if status.succeeded and await asyncio.to_thread(self.binary.is_file):
                self._settle(DroidState(Phase.INSTALLED))
            elif status.succeeded:
                self._settle(
                    DroidState(Phase.FAILED, f"{INSTALL_UNIT} ended without {self.binary}")
                )
            else:
                said = None if status.active_state == "inactive" else await last_words(INSTALL_UNIT)
                if self._following:
                    self._settle(DroidState(Phase.FAILED, unit_failure(status, said)))
        except EOFError:
            # The bus went away under the call: boxd is stopping, and its next start looks again.
            log.info("stopped following %s: boxd's bus connection closed", INSTALL_UNIT)
        except Exception:
            log.exception("could not follow %s", INSTALL_UNIT)

    def _settle(self, state: DroidState) -> None:
        # Two checks may read the same end; the first one settles it.
        if self.state.phase != Phase.INSTALLING:
            return
        self._following = False
        self.systemd.unwatch(INSTALL_UNIT)
        self.state = state
        if state.phase == Phase.INSTALLED:
            log.info("Droid %s is installed at %s", VERSION, self.binary)
        else:
            log.warning("Droid %s could not be installed: %s", VERSION, state.why)
        self.changed()
