"""The manager's side of installing an agent (Droid here, Claude Code where said): following the
install unit, and what queued tasks of that agent do meanwhile (wait without a place, start once
it is there, fail when it could not be)."""

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from boxd.droid.installer import failure_reason
from boxd.manager import agent_install
from boxd.manager.admission import next_to_start
from boxd.manager.agent_install import (
    CLAUDE,
    CLAUDE_INSTALL_UNIT,
    DROID_INSTALL_UNIT,
    AgentInstall,
    InstallState,
    Phase,
    sort_queue,
)
from boxd.manager.units.systemd import CLD_EXITED, CLD_KILLED, SystemdError, UnitStatus
from boxd.wire.models.task import Task
from tests.support.tasks import a_task

PENDING = UnitStatus("inactive", "dead", "success", 0, 0, job_pending=True)
RUNNING = UnitStatus("activating", "start", "success", 0, 0)
SUCCEEDED = UnitStatus("inactive", "dead", "success", CLD_EXITED, 0)
EXITED_1 = UnitStatus("failed", "failed", "exit-code", CLD_EXITED, 1)
KILLED = UnitStatus("failed", "failed", "signal", CLD_KILLED, 9)


def queued(task_id: str, at: float, worker: str) -> Task:
    return a_task(task_id).model_copy(update={"createdAt": at, "worker": worker})


QUEUE = [
    queued("t000000001", 1.0, "droid"),
    queued("t000000002", 2.0, "fake"),
    queued("t000000003", 3.0, "droid"),
    queued("t000000004", 4.0, "fake"),
]


def droid(state: InstallState) -> dict[str, InstallState]:
    return {"droid": state}


def ids(tasks: list[Task]) -> list[str]:
    return [t.id for t in tasks]


def test_while_installing_droid_tasks_wait_without_a_place() -> None:
    may_start, refused = sort_queue(QUEUE, droid(InstallState(Phase.INSTALLING)))
    assert refused == []
    # Two places, both for the fake tasks behind the older Droid ones.
    chosen = next_to_start(may_start, holding=set(), limit=2)
    assert ids(chosen) == ["t000000002", "t000000004"]


def test_once_installed_the_queue_goes_oldest_first() -> None:
    may_start, refused = sort_queue(QUEUE, droid(InstallState(Phase.INSTALLED)))
    assert refused == []
    assert ids(next_to_start(may_start, holding={"t000000002"}, limit=3)) == [
        "t000000001",
        "t000000003",
    ]


def test_while_paused_every_task_stays_queued_whatever_droid_is_doing() -> None:
    failed = InstallState(Phase.FAILED, "no network")
    for state in (InstallState(Phase.INSTALLED), InstallState(Phase.INSTALLING), failed):
        assert sort_queue(QUEUE, droid(state), paused=True) == ([], [])
    # Resumed, they go in the order they came; a failed install's tasks are refused then.
    may_start, refused = sort_queue(QUEUE, droid(failed), paused=False)
    assert ids(refused) == ["t000000001", "t000000003"]
    assert ids(next_to_start(may_start, holding=set(), limit=4)) == ["t000000002", "t000000004"]


def test_a_failed_install_fails_queued_droid_tasks_in_plain_words() -> None:
    state = InstallState(Phase.FAILED, "https://registry.example could not be reached: timed out")
    may_start, refused = sort_queue(QUEUE, droid(state))
    assert ids(refused) == ["t000000001", "t000000003"]
    assert ids(may_start) == ["t000000002", "t000000004"]
    assert state.task_error == (
        "Droid could not be installed: https://registry.example could not be reached: timed "
        "out. boxd tries again the next time it starts (systemctl restart boxd)."
    )
    assert state.public() == {
        "version": "0.225.2",
        "installed": False,
        "installing": False,
        "error": state.task_error,
    }
    assert InstallState(Phase.INSTALLED).task_error is None
    assert InstallState(Phase.INSTALLING).task_error is None


def test_each_agent_s_tasks_wait_for_their_own_install() -> None:
    claude_queue = [*QUEUE, queued("t000000005", 5.0, "claude")]
    installing = InstallState(Phase.INSTALLING, agent=CLAUDE)
    states = {"droid": InstallState(Phase.INSTALLED), "claude": installing}
    may_start, refused = sort_queue(claude_queue, states)
    assert refused == []
    assert ids(may_start) == ["t000000001", "t000000002", "t000000003", "t000000004"]
    failed = InstallState(Phase.FAILED, "no network", CLAUDE)
    may_start, refused = sort_queue(claude_queue, {**states, "claude": failed})
    assert ids(refused) == ["t000000005"]
    assert failed.task_error == (
        "Claude Code could not be installed: no network. boxd tries again the next time it "
        "starts (systemctl restart boxd)."
    )
    assert failed.public()["version"] == "2.1.337"


def test_a_missing_agent_not_yet_installing_keeps_its_tasks_waiting() -> None:
    claude_queue = [*QUEUE, queued("t000000005", 5.0, "claude")]
    missing = InstallState(Phase.NOT_INSTALLED, agent=CLAUDE)
    may_start, refused = sort_queue(claude_queue, {"claude": missing})
    assert refused == []
    assert "t000000005" not in ids(may_start)
    assert missing.task_error is None
    assert missing.public() == {
        "version": "2.1.337",
        "installed": False,
        "installing": False,
        "error": None,
    }


class FakeSystemd:
    """systemd as the install unit's follower sees it: a scripted series of unit states, and
    the calls boxd made."""

    def __init__(self, states: list[UnitStatus | None], start_fails: bool = False) -> None:
        self.states = states
        self.start_fails = start_fails
        self.calls: list[str] = []
        self.watching: dict[str, Callable[[], None]] = {}

    def watch(self, name: str, changed: Callable[[], None]) -> None:
        self.watching[name] = changed

    def unwatch(self, name: str) -> None:
        self.watching.pop(name, None)

    async def reset_failed(self, name: str) -> None:
        self.calls.append(f"reset {name}")

    async def start_unit(self, name: str) -> None:
        self.calls.append(f"start {name}")
        if self.start_fails:
            raise SystemdError("org.freedesktop.systemd1.NoSuchUnit", "Unit not found.")

    async def status(self, name: str) -> UnitStatus | None:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def announce(self, unit: str = DROID_INSTALL_UNIT) -> None:
        """systemd says the unit changed."""
        self.watching[unit]()


class Follow:
    def __init__(self, tmp_path: Path, systemd: FakeSystemd) -> None:
        self.binary = tmp_path / "droid" / "0.225.2" / "droid"
        self.settled = asyncio.Event()
        self.systemd = systemd
        self.install = AgentInstall(systemd, self.settled.set, self.binary)  # type: ignore[arg-type]

    async def settle(self) -> InstallState:
        await asyncio.wait_for(self.settled.wait(), 5)
        return self.install.state


async def test_installed_already_starts_nothing(tmp_path: Path) -> None:
    follow = Follow(tmp_path, FakeSystemd([SUCCEEDED]))
    follow.binary.parent.mkdir(parents=True)
    follow.binary.write_bytes(b"droid")
    follow = Follow(tmp_path, follow.systemd)
    assert follow.install.state.phase == Phase.INSTALLED
    await follow.install.begin()
    assert follow.install.state.phase == Phase.INSTALLED
    assert follow.systemd.calls == []


async def test_a_queued_start_is_not_an_end_and_success_installs(tmp_path: Path) -> None:
    systemd = FakeSystemd([PENDING, RUNNING, SUCCEEDED])
    follow = Follow(tmp_path, systemd)
    assert follow.install.state.public()["installing"] is False
    await follow.install.begin()
    assert follow.install.state.public()["installing"] is True
    assert systemd.calls == [f"reset {DROID_INSTALL_UNIT}", f"start {DROID_INSTALL_UNIT}"]
    # The unit's folder is there for ReadWritePaths before it starts.
    assert follow.binary.parent.parent.is_dir()
    await asyncio.sleep(0)
    systemd.announce()
    await asyncio.sleep(0)
    assert not follow.settled.is_set()
    assert follow.install.state.phase == Phase.INSTALLING
    follow.binary.parent.mkdir()
    follow.binary.write_bytes(b"droid")
    systemd.announce()
    state = await follow.settle()
    assert state.public() == {
        "version": "0.225.2",
        "installed": True,
        "installing": False,
        "error": None,
    }
    assert DROID_INSTALL_UNIT not in systemd.watching


async def test_a_failed_unit_says_why_from_its_last_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = "Droid 0.225.2 could not be installed: http://x/y.tgz answered 404 Not Found"

    async def said(unit: str) -> str:
        assert unit == DROID_INSTALL_UNIT
        return line

    monkeypatch.setattr(agent_install, "last_words", said)
    systemd = FakeSystemd([RUNNING, EXITED_1])
    follow = Follow(tmp_path, systemd)
    await follow.install.begin()
    systemd.announce()
    state = await follow.settle()
    assert state.phase == Phase.FAILED
    assert state.why == failure_reason(line) == "http://x/y.tgz answered 404 Not Found"


async def test_a_killed_unit_and_a_success_without_binary_are_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def nothing(unit: str) -> None:
        return None

    monkeypatch.setattr(agent_install, "last_words", nothing)
    killed = Follow(tmp_path, FakeSystemd([KILLED]))
    await killed.install.begin()
    assert (await killed.settle()).why == f"{DROID_INSTALL_UNIT} was killed by SIGKILL"
    empty = Follow(tmp_path / "other", FakeSystemd([SUCCEEDED]))
    await empty.install.begin()
    assert (await empty.settle()).why == f"{DROID_INSTALL_UNIT} ended without {empty.binary}"


async def test_a_unit_that_cannot_start_fails_at_once(tmp_path: Path) -> None:
    follow = Follow(tmp_path, FakeSystemd([None], start_fails=True))
    await follow.install.begin()
    state = await follow.settle()
    assert state.phase == Phase.FAILED
    assert state.why == f"{DROID_INSTALL_UNIT} could not be started: Unit not found."


async def test_claude_code_is_not_installed_until_its_first_task_begins_its_install(
    tmp_path: Path,
) -> None:
    systemd = FakeSystemd([PENDING, SUCCEEDED])
    settled = asyncio.Event()
    binary = tmp_path / "claude" / "2.1.337" / "claude"
    install = AgentInstall(systemd, settled.set, binary, agent=CLAUDE)  # type: ignore[arg-type]
    assert install.state.public() == {
        "version": "2.1.337",
        "installed": False,
        "installing": False,
        "error": None,
    }
    assert systemd.calls == []
    await install.begin_once()
    assert install.state.public()["installing"] is True
    assert systemd.calls == [f"reset {CLAUDE_INSTALL_UNIT}", f"start {CLAUDE_INSTALL_UNIT}"]
    await install.begin_once()
    assert len(systemd.calls) == 2
    binary.parent.mkdir()
    binary.write_bytes(b"claude")
    await asyncio.sleep(0)
    systemd.announce(CLAUDE_INSTALL_UNIT)
    await asyncio.wait_for(settled.wait(), 5)
    assert install.state.public()["installed"] is True
