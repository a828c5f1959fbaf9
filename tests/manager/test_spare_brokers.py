"""A spare's broker and worker, started ahead (boxd/manager/spares.py), with stand-ins for systemd,
the store, useradd, ip and /proc: their units start once its user and namespace are made; a
spare dropped loses its units before its user, and keeps its user when they could not be
stopped; a task that takes a spare whose broker started before the vault changed gets a new
broker; a task whose spare's worker cannot be woken, or runs in a unit that is not the one the
task would get now, gets a new worker."""

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from dbus_fast.aio import MessageBus

from boxd.manager.box import Box
from boxd.manager.record.store import Store
from boxd.manager.spares import Spares
from boxd.manager.units.systemd import Systemd, SystemdError, UnitStatus
from boxd.manager.units.task_os import TaskOS
from boxd.manager.units.worker_unit import (
    AHEAD_MODULE,
    ahead_worker_properties,
    broker_service_unit,
    broker_units,
    task_slice,
    worker_unit,
)
from boxd.wire.caller import Caller, Role
from boxd.wire.models.settings import Settings
from boxd.wire.models.task import Task, TaskState
from boxd.wire.secret_names import BOX
from tests.support.machine_checks import fit_machine
from tests.support.tasks import a_task

SPARE = "t000000001"


WORKER_PID = 4242
CLD_KILLED = os.CLD_KILLED


class FakeSystemd:
    def __init__(self, said: list[str], fail_stop: bool = False) -> None:
        self.said = said
        self.fail_stop = fail_stop
        self.reloads = 0
        self.reloaded: Callable[[], None] = lambda: None
        self.pid: int | None = WORKER_PID
        self.pid_fails = False
        self.signal_fails = False
        self.started: dict[str, Any] = {}
        self.watched: dict[str, Callable[[], None]] = {}
        self.ended = False

    async def start_unit(self, name: str) -> None:
        self.said.append(f"start {name}")

    async def stop_unit(self, name: str) -> None:
        if self.fail_stop:
            raise SystemdError("org.freedesktop.systemd1.Failed", "could not stop")
        self.said.append(f"stop {name}")

    async def reset_failed(self, name: str) -> None:
        pass

    def watch(self, name: str, changed: Callable[[], None]) -> None:
        self.watched[name] = changed

    def unwatch(self, name: str) -> None:
        self.watched.pop(name, None)

    async def status(self, name: str) -> UnitStatus:
        if self.ended:
            return UnitStatus("failed", "failed", "signal", CLD_KILLED, signal.SIGKILL)
        return UnitStatus("active", "running", "success", 0, 0)

    async def start_transient(self, name: str, properties: Any) -> None:
        self.said.append(f"start {name}")
        self.started[name] = dict(properties)

    async def main_pid(self, name: str) -> int | None:
        if self.pid_fails:
            raise SystemdError("org.freedesktop.DBus.Error.Timeout", "no answer")
        return self.pid

    async def signal_main(self, name: str, number: int) -> None:
        if self.signal_fails:
            raise SystemdError("org.freedesktop.systemd1.NoSuchProcess", "no main process")
        self.said.append(f"signal {number} {name}")


class FakeStore:
    def __init__(self) -> None:
        self.current = Settings()

    async def claim_uid(self, task_id: str, *args: Any) -> int:
        return 1_879_048_193

    async def settings(self) -> Settings:
        return self.current


@pytest.fixture
def said() -> list[str]:
    return []


def _task_os(said: list[str]) -> TaskOS:
    """useradd, ip and /proc as they would be for a spare's worker that is ready."""

    async def ensure_user(name: str, home: Path, uid: int) -> None:
        said.append(f"useradd {name}")

    async def remove_user(name: str) -> None:
        said.append(f"userdel {name}")

    async def ensure_netns(task_id: str) -> Path:
        said.append(f"netns add {task_id}")
        return Path("/run/netns") / task_id

    async def remove_netns(task_id: str) -> None:
        said.append(f"netns del {task_id}")

    async def prepare_home(home: Path, task_id: str, uid: int) -> Path:
        said.append(f"home {task_id}")
        return home

    async def remove_home(home: Path, task_id: str) -> None:
        said.append(f"rm home {task_id}")

    def ready(pid: int, view: Path, wakes: Any) -> str | None:
        assert pid == WORKER_PID
        return None

    return TaskOS(
        ensure_user=ensure_user,
        remove_user=remove_user,
        ensure_netns=ensure_netns,
        remove_netns=remove_netns,
        prepare_home=prepare_home,
        remove_home=remove_home,
        catches=lambda pid, wakes: pid == WORKER_PID,
        not_ready=ready,
    )


def _box(tmp_path: Path, said: list[str], fail_stop: bool = False) -> Box:
    box = Box(
        tmp_path,
        cast(Store, FakeStore()),
        cast(MessageBus, None),
        cast(Systemd, FakeSystemd(said, fail_stop)),
        _task_os(said),
        check_machine=fit_machine,
    )
    (tmp_path / "tasks").mkdir()
    box.vault.open()
    return box


def _task() -> Task:
    return a_task(SPARE).model_copy(update={"state": TaskState.RUNNING})


async def test_a_spares_broker_and_worker_start_once_its_user_and_namespace_are_made(
    tmp_path: Path, said: list[str]
) -> None:
    box = _box(tmp_path, said)
    await box.spare_maker.make(SPARE)
    made = {f"useradd box-{SPARE}", f"netns add {SPARE}"}
    assert set(said[:2]) == made
    assert said[2:] == [
        *(f"start {unit}" for unit in broker_units(SPARE)),
        f"home {SPARE}",
        f"start {worker_unit(SPARE)}",
    ]
    started = cast(FakeSystemd, box.systemd).started[worker_unit(SPARE)]
    assert started["ExecStart"].value[0][1][-2:] == ["-m", AHEAD_MODULE]
    # Its sockets' directory is there, the task's own mode: its worker passes, no one lists it.
    assert (tmp_path / "tasks" / SPARE).stat().st_mode & 0o777 == 0o711
    # And its view's mount point, root's and empty, which its worker passes into and waits in.
    view = tmp_path / "tasks" / SPARE / "work"
    assert view.stat().st_mode & 0o777 == 0o711
    assert list(view.iterdir()) == []


async def test_a_spare_dropped_loses_its_broker_units_before_its_user(
    tmp_path: Path, said: list[str]
) -> None:
    box = _box(tmp_path, said)
    await box.spare_maker.drop(SPARE)
    stops = [f"stop {unit}" for unit in reversed(broker_units(SPARE))]
    # Its worker's slice too: systemd keeps a slice loaded until it is stopped.
    worker = [f"stop {worker_unit(SPARE)}", f"stop {task_slice(SPARE)}"]
    # Its home and directories before its user and namespace, which a manager cut off in
    # between leaves for the next to find (spares.leftovers) and drop again.
    assert said == [
        *worker,
        *stops,
        f"rm home {SPARE}",
        f"userdel box-{SPARE}",
        f"netns del {SPARE}",
    ]
    assert stops[0] == f"stop {broker_service_unit(SPARE)}"


async def test_a_spare_whose_units_could_not_be_stopped_keeps_its_user(
    tmp_path: Path, said: list[str]
) -> None:
    # The next manager finds the user (spares.leftovers) and tries again: no unit is left
    # whose socket belongs to a user that is gone.
    box = _box(tmp_path, said, fail_stop=True)
    with pytest.raises(SystemdError):
        await box.spare_maker.drop(SPARE)
    assert said == []


async def test_a_spares_broker_is_kept_while_the_vault_is_unchanged(
    tmp_path: Path, said: list[str]
) -> None:
    box = _box(tmp_path, said)
    await box.spare_maker.make(SPARE)
    said.clear()
    await box.lifecycle._start_units(_task())
    # Its worker, started ahead too, is told to be the task's fake worker, and watched.
    assert said == [f"signal {signal.SIGUSR1} {worker_unit(SPARE)}"]
    assert worker_unit(SPARE) in cast(FakeSystemd, box.systemd).watched


async def test_a_spares_broker_started_before_the_vault_changed_is_stopped_first(
    tmp_path: Path, said: list[str]
) -> None:
    box = _box(tmp_path, said)
    await box.spare_maker.make(SPARE)
    # A secret set or removed since: the broker started ahead may hold the old vault.
    box.vault.changes += 1
    said.clear()
    await box.lifecycle._start_units(_task())
    # Its worker holds no secret: it is woken, and its first connection starts a new broker.
    assert said == [
        f"stop {broker_service_unit(SPARE)}",
        f"signal {signal.SIGUSR1} {worker_unit(SPARE)}",
    ]


OWNER = Caller(Role.OWNER, "owner", user="owner")


async def test_a_secret_removed_while_the_task_starts_never_reaches_the_spares_broker(
    tmp_path: Path, said: list[str]
) -> None:
    box = _box(tmp_path, said)
    (box.vault.place(BOX) / "ANTHROPIC_API_KEY.cred").write_bytes(b"sealed")
    await box.spare_maker.make(SPARE)
    said.clear()

    async def settings() -> Settings:
        # The store thread's trip, while the owner's removal runs to its end and is answered.
        await box.vault.remove_secret(OWNER, "ANTHROPIC_API_KEY")
        said.append("owner told: removed")
        return Settings()

    box.store.settings = settings  # type: ignore[method-assign]
    await box.lifecycle._start_units(_task())
    assert said == [
        "owner told: removed",
        f"stop {broker_service_unit(SPARE)}",
        f"signal {signal.SIGUSR1} {worker_unit(SPARE)}",
    ]


async def test_a_secret_removed_as_the_worker_starts_waits_for_the_start(
    tmp_path: Path, said: list[str]
) -> None:
    # The removal is answered only once the worker is started: the task started before it, and
    # kept the broker whose vault held the secret then, as every task started before does.
    box = _box(tmp_path, said)
    (box.vault.place(BOX) / "ANTHROPIC_API_KEY.cred").write_bytes(b"sealed")
    await box.spare_maker.make(SPARE)
    said.clear()
    systemd = cast(FakeSystemd, box.systemd)
    woken = systemd.signal_main
    removal: list[asyncio.Task[None]] = []

    async def remove() -> None:
        await box.vault.remove_secret(OWNER, "ANTHROPIC_API_KEY")
        said.append("owner told: removed")

    async def signal_main(name: str, number: int) -> None:
        removal.append(asyncio.create_task(remove()))
        await asyncio.sleep(0.01)
        await woken(name, number)

    systemd.signal_main = signal_main  # type: ignore[method-assign]
    await box.lifecycle._start_units(_task())
    await removal[0]
    assert said == [f"signal {signal.SIGUSR1} {worker_unit(SPARE)}", "owner told: removed"]


async def test_a_dropped_spare_leaves_no_directory(tmp_path: Path, said: list[str]) -> None:
    box = _box(tmp_path, said)
    await box.spare_maker.make(SPARE)
    await box.spare_maker.drop(SPARE)
    assert not (tmp_path / "tasks" / SPARE).exists()


async def test_a_dropped_spare_leaves_a_directory_with_something_in_it(
    tmp_path: Path, said: list[str]
) -> None:
    box = _box(tmp_path, said)
    await box.spare_maker.make(SPARE)
    (tmp_path / "tasks" / SPARE / "left").write_text("x")
    await box.spare_maker.drop(SPARE)
    assert (tmp_path / "tasks" / SPARE / "left").read_text() == "x"


async def test_a_spares_broker_started_before_systemd_reloaded_is_stopped_first(
    tmp_path: Path, said: list[str]
) -> None:
    box = _box(tmp_path, said)
    await box.spare_maker.make(SPARE)
    # A daemon-reload since (a drop-in for box-broker@.service, say): the broker started ahead
    # runs with its unit as it was, as no task's broker started from now on does.
    cast(FakeSystemd, box.systemd).reloads += 1
    said.clear()
    await box.lifecycle._start_units(_task())
    # Its worker's unit is as it was too: it goes, and a new one starts.
    assert said == [
        f"stop {broker_service_unit(SPARE)}",
        f"stop {worker_unit(SPARE)}",
        f"start {worker_unit(SPARE)}",
    ]


async def test_a_droid_task_wakes_the_spares_worker_with_its_own_signal(
    tmp_path: Path, said: list[str]
) -> None:
    box = _box(tmp_path, said)
    await box.spare_maker.make(SPARE)
    said.clear()
    await box.lifecycle._start_units(_task().model_copy(update={"worker": "droid"}))
    assert said == [f"signal {signal.SIGUSR2} {worker_unit(SPARE)}"]


# Its sandbox's limits (MemoryMax=, TasksMax=, CPUQuota=) are the settings' of when it started:
# a task gets the unit of now. A change that is not in its unit (a default budget) keeps it.
@pytest.mark.parametrize(
    ("changed", "replaced"),
    [(Settings(taskCPUPercent=50), True), (Settings(defaultBudgetCents=7), False)],
)
async def test_a_settings_change_replaces_the_spares_worker_if_its_unit_changes(
    tmp_path: Path, said: list[str], changed: Settings, replaced: bool
) -> None:
    box = _box(tmp_path, said)
    await box.spare_maker.make(SPARE)
    said.clear()

    async def settings() -> Settings:
        return changed

    box.store.settings = settings  # type: ignore[method-assign]
    await box.lifecycle._start_units(_task())
    if not replaced:
        assert said == [f"signal {signal.SIGUSR1} {worker_unit(SPARE)}"]
        return
    assert said == [f"stop {worker_unit(SPARE)}", f"start {worker_unit(SPARE)}"]
    started = cast(FakeSystemd, box.systemd).started[worker_unit(SPARE)]
    assert started["CPUQuotaPerSecUSec"].value == 500_000
    assert started["ExecStart"].value[0][1][-1] == "boxd.workers.fake"


# What systemd says of a spare's worker whose task then gets a new one, rather than failing:
# its process is gone; its pid is not given (an error on the bus); it went between the check and
# the signal (no main process to send it to).
@pytest.mark.parametrize(
    ("fault", "value"), [("pid", None), ("pid_fails", True), ("signal_fails", True)]
)
async def test_a_spares_worker_systemd_cannot_reach_is_replaced(
    tmp_path: Path, said: list[str], fault: str, value: object
) -> None:
    box = _box(tmp_path, said)
    await box.spare_maker.make(SPARE)
    systemd = cast(FakeSystemd, box.systemd)
    setattr(systemd, fault, value)
    said.clear()
    await box.lifecycle._start_units(_task())
    assert said == [f"stop {worker_unit(SPARE)}", f"start {worker_unit(SPARE)}"]
    # The new worker is the one watched.
    assert worker_unit(SPARE) in systemd.watched


async def test_a_spares_worker_not_ready_is_replaced_not_signalled(
    tmp_path: Path, said: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not yet catching its signal (which would kill it), or not seeing the task's view (it
    # would run on an empty directory): never woken.
    box = _box(tmp_path, said)
    await box.spare_maker.make(SPARE)
    monkeypatch.setattr(box.task_os, "not_ready", lambda *_: "it does not yet catch SIGUSR1")
    said.clear()
    await box.lifecycle._start_units(_task())
    assert said == [f"stop {worker_unit(SPARE)}", f"start {worker_unit(SPARE)}"]


async def test_a_task_that_took_no_spare_starts_its_worker(tmp_path: Path, said: list[str]) -> None:
    box = _box(tmp_path, said)
    await box.lifecycle._start_units(_task())
    assert said == [f"start {worker_unit(SPARE)}"]


async def test_a_spare_is_ready_only_once_its_worker_catches_its_signals(
    tmp_path: Path, said: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Taken before, its worker would be found not ready and replaced: slower than no spare.
    looks: list[int] = []

    def catches(pid: int, wakes: Any) -> bool:
        looks.append(pid)
        return len(looks) >= 3

    box = _box(tmp_path, said)
    monkeypatch.setattr(box.spare_maker, "poll_seconds", 0)
    monkeypatch.setattr(box.task_os, "catches", catches)
    spares = Spares(box.spare_maker.make, box.spare_maker.drop, count=1)
    spares.fill_soon()
    await asyncio.sleep(0)
    assert spares.take() is None
    await spares.filled()
    assert looks == [WORKER_PID] * 3
    assert spares.take() is not None


async def test_a_spare_whose_worker_never_gets_ready_is_still_made(
    tmp_path: Path, said: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its user, namespace and broker still spare the task their making; its worker is replaced.
    box = _box(tmp_path, said)
    monkeypatch.setattr(box.spare_maker, "ready_seconds", 0.05)
    monkeypatch.setattr(box.spare_maker, "poll_seconds", 0.01)
    monkeypatch.setattr(box.task_os, "catches", lambda pid, wakes: False)
    spares = Spares(box.spare_maker.make, box.spare_maker.drop, count=1)
    spares.fill_soon()
    await spares.filled()
    assert spares.take() is not None


async def test_a_spare_whose_worker_ends_before_it_is_ready_is_not_handed_out(
    tmp_path: Path, said: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its imports failed, or it was killed: its making stops at once, rather than wait out
    # AHEAD_READY_SECONDS and hand out a spare whose task would start a new worker anyway.
    box = _box(tmp_path, said)
    monkeypatch.setattr(box.spare_maker, "ready_seconds", 1.0)
    monkeypatch.setattr(box.spare_maker, "poll_seconds", 0)
    systemd = cast(FakeSystemd, box.systemd)
    systemd.pid = None
    systemd.ended = True
    spares = Spares(box.spare_maker.make, box.spare_maker.drop, count=1)
    spares.fill_soon()
    await spares.filled()
    assert spares.take() is None
    (made,) = {line.split()[-1] for line in said if line.startswith("netns add")}
    assert said[-2:] == [f"userdel box-{made}", f"netns del {made}"]


async def test_a_spares_worker_not_forked_yet_is_waited_for(
    tmp_path: Path, said: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # systemd has no main pid for it until it forks: its unit is still starting, not ended.
    box = _box(tmp_path, said)
    monkeypatch.setattr(box.spare_maker, "poll_seconds", 0)
    pids: list[int | None] = [None, None, WORKER_PID]

    async def main_pid(name: str) -> int | None:
        return pids.pop(0) if len(pids) > 1 else pids[0]

    monkeypatch.setattr(box.systemd, "main_pid", main_pid)
    spares = Spares(box.spare_maker.make, box.spare_maker.drop, count=1)
    spares.fill_soon()
    await spares.filled()
    assert spares.take() is not None
    assert pids == [WORKER_PID]


async def _two_spares(box: Box, said: list[str]) -> list[str]:
    box.spares.fill_soon()
    await box.spares.filled()
    ready = box.spares.ready()
    assert len(ready) == 2
    said.clear()
    return ready


async def _background(box: Box) -> None:
    while pending := [job for job in box.background.jobs if not job.done()]:
        await asyncio.gather(*pending)
    await box.spares.filled()


async def test_a_spare_whose_worker_ended_is_made_again(tmp_path: Path, said: list[str]) -> None:
    # Killed while it waited, or out of memory: a task that took it would start a new worker
    # anyway, so it is dropped and another made at once.
    box = _box(tmp_path, said)
    first, second = await _two_spares(box, said)
    systemd = cast(FakeSystemd, box.systemd)
    systemd.ended = True
    systemd.watched[worker_unit(first)]()
    await _background(box)
    ready = box.spares.ready()
    assert first not in ready and second in ready and len(ready) == 2
    assert f"stop {worker_unit(first)}" in said and f"userdel box-{first}" in said
    (made,) = set(ready) - {second}
    assert f"useradd box-{made}" in said
    # The dropped spare's worker is no longer watched; the new one's is.
    assert worker_unit(first) not in systemd.watched
    assert worker_unit(made) in systemd.watched


async def test_a_spares_worker_that_only_changed_is_kept(tmp_path: Path, said: list[str]) -> None:
    box = _box(tmp_path, said)
    first, second = await _two_spares(box, said)
    cast(FakeSystemd, box.systemd).watched[worker_unit(first)]()
    await _background(box)
    assert box.spares.ready() == [first, second]
    assert said == []


async def test_a_taken_spares_worker_that_ended_is_its_tasks(
    tmp_path: Path, said: list[str]
) -> None:
    # Its task, which took it, starts a new worker when it starts (_wake_ahead).
    box = _box(tmp_path, said)
    first, _ = await _two_spares(box, said)
    assert box.spares.take() == first
    systemd = cast(FakeSystemd, box.systemd)
    systemd.ended = True
    systemd.watched[worker_unit(first)]()
    await _background(box)
    assert said == []


@pytest.mark.parametrize(
    ("changed", "renewed"),
    [(Settings(taskCPUPercent=50), True), (Settings(defaultBudgetCents=7), False)],
)
async def test_a_settings_change_makes_again_the_spares_whose_worker_unit_it_changes(
    tmp_path: Path, said: list[str], changed: Settings, renewed: bool
) -> None:
    box = _box(tmp_path, said)
    before = await _two_spares(box, said)
    await box.spare_maker.renew_stale(changed)
    await _background(box)
    after = box.spares.ready()
    assert len(after) == 2
    assert (set(after) & set(before) == set()) is renewed
    assert (set(after) == set(before)) is not renewed


async def test_a_spare_being_made_as_the_settings_change_is_made_again_once_ready(
    tmp_path: Path, said: list[str]
) -> None:
    # Its worker's unit was begun with the settings of before while the change looked only at the
    # ready spares (a flaky VM test showed it: a spare kept a CPU quota of before).
    box = _box(tmp_path, said)
    systemd = cast(FakeSystemd, box.systemd)
    reached, hold = asyncio.Event(), asyncio.Event()
    start = systemd.start_transient

    async def held(name: str, properties: Any) -> None:
        await start(name, properties)
        reached.set()
        await hold.wait()

    systemd.start_transient = held  # type: ignore[method-assign]
    box.spares.fill_soon()
    await reached.wait()
    changed = Settings(taskCPUPercent=50)
    cast(FakeStore, box.store).current = changed
    renewing = asyncio.ensure_future(box.spare_maker.renew_stale(changed))
    await asyncio.sleep(0.01)
    hold.set()
    await renewing
    await _background(box)
    ready = box.spares.ready()
    assert len(ready) == 2
    for spare in ready:
        ahead = box.spare_maker.take_ahead(spare)
        assert ahead is not None
        now = ahead_worker_properties(tmp_path, spare, changed)
        assert ahead.worker_holds(systemd.reloads, now), spare


async def test_a_reload_makes_again_the_spares_started_before_it(
    tmp_path: Path, said: list[str]
) -> None:
    # A drop-in for a task's units, or a package's: the spares made before run with their units
    # as they were. They are made again as systemd ends the reload, not as tasks take them.
    box = _box(tmp_path, said)
    before = await _two_spares(box, said)
    systemd = cast(FakeSystemd, box.systemd)
    systemd.reloads += 1
    systemd.reloaded()
    await _background(box)
    after = box.spares.ready()
    assert len(after) == 2 and set(after).isdisjoint(before)
    # And made once: the new spares are as new as the units.
    said.clear()
    systemd.reloaded()
    await _background(box)
    assert box.spares.ready() == after and said == []
