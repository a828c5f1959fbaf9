"""Whether an agent boxd installs itself (Droid, Claude Code) is installed, being installed or
could not be, and what that means for its queued tasks. When boxd starts and Droid's pinned
binary is missing, it starts boxd-droid-install.service and follows the unit to its end; a
failed install is tried again the next time boxd starts, never in a loop. Claude Code's install
(boxd-claude-install.service) is followed the same way, described by its own `Agent`."""

import asyncio
import logging
import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from boxd.claude import installer as claude_installer
from boxd.claude.release import claude_binary
from boxd.droid import installer as droid_installer
from boxd.droid.release import VERSION, droid_binary
from boxd.manager.units.last_words import last_words
from boxd.manager.units.systemd import CLD_EXITED, CLD_KILLED, Systemd, SystemdError, UnitStatus
from boxd.wire.models.task import Task
from boxd.wire.models.task_request import Worker

log = logging.getLogger(__name__)

DROID_INSTALL_UNIT = "boxd-droid-install.service"
CLAUDE_INSTALL_UNIT = "boxd-claude-install.service"
TRY_AGAIN = "boxd tries again the next time it starts (systemctl restart boxd)."


@dataclass(frozen=True)
class Agent:
    """An agent boxd installs itself: its worker, its pinned binary and the unit installing it."""

    worker: Worker
    name: str
    version: str
    unit: str
    binary: Callable[[], Path]
    # The reason in the install's last line, or None if it printed none.
    failure_reason: Callable[[str], str | None]


DROID = Agent(
    Worker.DROID,
    "Droid",
    VERSION,
    DROID_INSTALL_UNIT,
    droid_binary,
    droid_installer.failure_reason,
)
CLAUDE = Agent(
    Worker.CLAUDE,
    "Claude Code",
    claude_installer.CLAUDE.version,
    CLAUDE_INSTALL_UNIT,
    claude_binary,
    claude_installer.failure_reason,
)


class Phase(StrEnum):
    # Missing, and no install started yet (Claude Code's waits for the first Claude task).
    NOT_INSTALLED = "not installed"
    INSTALLED = "installed"
    INSTALLING = "installing"
    FAILED = "failed"


@dataclass(frozen=True)
class InstallState:
    phase: Phase
    # Why the install failed, in plain words; None unless it did.
    why: str | None = None
    agent: Agent = DROID

    @property
    def task_error(self) -> str | None:
        """What a task of this agent that cannot run says, or None while it may run or wait."""
        if self.phase != Phase.FAILED:
            return None
        return f"{self.agent.name} could not be installed: {self.why}. {TRY_AGAIN}"

    def public(self) -> dict[str, Any]:
        installed = self.phase == Phase.INSTALLED
        return {
            "version": self.agent.version,
            "installed": installed,
            "installing": self.phase == Phase.INSTALLING,
            "error": self.task_error,
        }


def sort_queue(
    queued: Iterable[Task], states: Mapping[str, InstallState], paused: bool = False
) -> tuple[list[Task], list[Task]]:
    """The queued tasks that may take a place now, and the tasks to fail at once because their
    agent could not be installed (`states`: by worker, the agents boxd installs). While an agent
    installs its tasks are neither: they wait without holding a place. While the owner has
    paused the agents no task is either: every one stays queued, as the seed says, and a task
    whose agent's install failed is refused once the agents resume."""
    may_start: list[Task] = []
    refused: list[Task] = []
    if paused:
        return may_start, refused
    for task in queued:
        state = states.get(task.worker)
        if state is None or state.phase == Phase.INSTALLED:
            may_start.append(task)
        elif state.phase == Phase.FAILED:
            refused.append(task)
    return may_start, refused


def unit_failure(status: UnitStatus, said: str | None, agent: Agent = DROID) -> str:
    """Why the install unit failed, from its last line or else from how it ended."""
    unit = agent.unit
    reason = agent.failure_reason(said) if said else None
    if reason:
        return reason
    if status.result == "timeout":
        return f"{unit} ran past its time limit (TimeoutStartSec) and systemd stopped it"
    if status.result == "signal" or status.main_code == CLD_KILLED:
        try:
            name = signal.Signals(status.main_status).name
        except ValueError:
            name = f"signal {status.main_status}"
        return f"{unit} was killed by {name}"
    if status.result == "exit-code" and status.main_code == CLD_EXITED:
        return f"{unit} exited with status {status.main_status} (journalctl -u {unit} says why)"
    if status.active_state == "inactive" and status.result == "success":
        return f"{unit} was stopped before it finished"
    return f"{unit} failed: systemd says {status.result}"


class AgentInstall:
    """The install's state for this run of boxd; `changed` is called when it settles."""

    def __init__(
        self,
        systemd: Systemd,
        changed: Callable[[], None],
        binary: Path | None = None,
        agent: Agent = DROID,
    ) -> None:
        self.systemd = systemd
        self.changed = changed
        self.agent = agent
        self.unit = agent.unit
        self.binary = binary or agent.binary()
        # Until begin(): a task created meanwhile waits, and is refused by nothing.
        self.state = InstallState(
            Phase.INSTALLED if self.binary.is_file() else Phase.NOT_INSTALLED, agent=agent
        )
        self._following = False
        self._begun = False
        self._background: set[asyncio.Task[None]] = set()

    async def begin_once(self) -> None:
        """begin(), unless this run of boxd already did: how Claude Code's install starts, when
        the first Claude task is queued, so a box that runs none never downloads it."""
        if not self._begun:
            await self.begin()

    async def begin(self) -> None:
        """Starts the install unless the binary is there. Returns once the unit's start job is
        queued, so boxd's start never waits for a download."""
        self._begun = True
        if await asyncio.to_thread(self.binary.is_file):
            self.state = InstallState(Phase.INSTALLED, agent=self.agent)
            return
        log.info(
            "%s %s is not installed; starting %s", self.agent.name, self.agent.version, self.unit
        )
        self.state = InstallState(Phase.INSTALLING, agent=self.agent)
        try:
            # The unit writes only there (ReadWritePaths), which must exist for it to start.
            await asyncio.to_thread(
                self.binary.parent.parent.mkdir, mode=0o755, parents=True, exist_ok=True
            )
            await self.systemd.reset_failed(self.unit)
            self.systemd.watch(self.unit, self._check_soon)
            await self.systemd.start_unit(self.unit)
        except (SystemdError, OSError) as error:
            self.systemd.unwatch(self.unit)
            self._settle(self._failed(f"{self.unit} could not be started: {error}"))
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
            status = await self.systemd.status(self.unit)
            if not self._following:
                return
            if status is None:
                self._settle(self._failed(f"{self.unit} was gone before boxd saw it end"))
                return
            if not status.finished:
                return
            if status.succeeded and await asyncio.to_thread(self.binary.is_file):
                self._settle(InstallState(Phase.INSTALLED, agent=self.agent))
            elif status.succeeded:
                self._settle(self._failed(f"{self.unit} ended without {self.binary}"))
            else:
                said = None if status.active_state == "inactive" else await last_words(self.unit)
                if self._following:
                    self._settle(self._failed(unit_failure(status, said, self.agent)))
        except EOFError:
            # The bus went away under the call: boxd is stopping, and its next start looks again.
            log.info("stopped following %s: boxd's bus connection closed", self.unit)
        except Exception:
            log.exception("could not follow %s", self.unit)

    def _failed(self, why: str) -> InstallState:
        return InstallState(Phase.FAILED, why, self.agent)

    def _settle(self, state: InstallState) -> None:
        # Two checks may read the same end; the first one settles it.
        if self.state.phase != Phase.INSTALLING:
            return
        self._following = False
        self.systemd.unwatch(self.unit)
        self.state = state
        if state.phase == Phase.INSTALLED:
            log.info("%s %s is installed at %s", self.agent.name, self.agent.version, self.binary)
        else:
            log.warning(
                "%s %s could not be installed: %s", self.agent.name, self.agent.version, state.why
            )
        self.changed()
