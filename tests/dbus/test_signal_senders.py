"""Signals are believed only from the unique name that owns org.boxd.Box1 (or systemd's name)
at that moment: `boxctl follow` and the manager's unit watching. A stranger's signal sent
straight to them (as `dbus-send --dest=<unique name>` does) is ignored, and so is boxd's old
unique name once it restarted. (A broker hears the owner's answers as the reply to its own
WaitApproval, no signal: tests/manager/test_approval_waits.py.)"""

import asyncio
from pathlib import Path
from typing import Any

from dbus_fast import Message, Variant

from boxd.cli.follow import follow
from boxd.dbus.client import BoxClient
from boxd.dbus.interface import BUS_NAME, GET_TASK, MANAGER, task_path
from boxd.dbus.name_owner import NameOwner
from boxd.manager.record.records import Records
from boxd.manager.record.store import Store
from boxd.manager.units.systemd import CLD_EXITED, Systemd, unit_path
from tests.support.fake_bus import FakeBus, owner_changed, signal
from tests.support.signals import BOXD, NEW_BOXD, STRANGER, TASK_ID, event
from tests.support.tasks import a_task

SYSTEMD = ":1.1"
SYSTEMD_NAME = "org.freedesktop.systemd1"


def answer(sender: str, state: str = "approved", destination: str | None = None) -> Message:
    return event(sender, 7, "approval", {"id": f"{TASK_ID}.k", "state": state}, destination)


async def test_the_owner_is_asked_then_followed() -> None:
    fake = FakeBus({BUS_NAME: BOXD})
    owner = NameOwner(fake.bus, BUS_NAME)
    await owner.start()
    assert owner.owner == BOXD
    assert any("member='NameOwnerChanged'" in r and f"arg0='{BUS_NAME}'" in r for r in fake.rules)
    fake.deliver(owner_changed(BUS_NAME, BOXD, ""))
    assert owner.owner is None
    fake.deliver(owner_changed(BUS_NAME, "", NEW_BOXD))
    assert owner.owner == NEW_BOXD
    # Another name's changes are not this one's.
    fake.deliver(owner_changed("org.example.Other", "", STRANGER))
    assert owner.owner == NEW_BOXD


async def test_only_the_bus_itself_announces_a_new_owner() -> None:
    fake = FakeBus({BUS_NAME: BOXD})
    owner = NameOwner(fake.bus, BUS_NAME)
    await owner.start()
    fake.deliver(owner_changed(BUS_NAME, BOXD, STRANGER, sender=STRANGER))
    assert owner.owner == BOXD
    assert not owner.sent(answer(STRANGER))
    assert owner.sent(answer(BOXD))


async def test_no_owner_believes_no_one() -> None:
    owner = NameOwner(FakeBus({}).bus, BUS_NAME)
    await owner.start()
    assert owner.owner is None
    assert not owner.sent(answer(BOXD))


async def test_a_change_while_asking_is_not_overwritten_by_an_older_answer() -> None:
    fake = FakeBus({BUS_NAME: BOXD})
    owner = NameOwner(fake.bus, BUS_NAME)

    def restarted_meanwhile() -> None:
        if fake.name_owner_asked == 1:
            fake.owners[BUS_NAME] = NEW_BOXD
            fake.deliver(owner_changed(BUS_NAME, BOXD, NEW_BOXD))

    fake.while_asking = restarted_meanwhile
    await owner.start()
    assert owner.owner == NEW_BOXD
    assert fake.name_owner_asked == 2


async def test_follow_shows_only_boxd_events() -> None:
    fake = FakeBus({BUS_NAME: BOXD})
    fake.answers[GET_TASK] = {"state": "running", "steps": []}
    shown: list[dict[str, Any]] = []
    following = asyncio.create_task(follow(BoxClient(fake.bus, MANAGER), TASK_ID, shown.append))
    # The fake answers at once: one turn of the loop brings follow to waiting for events.
    await asyncio.sleep(0)
    fake.deliver(event(STRANGER, 1, "task.step", {"text": "forged"}))
    fake.deliver(event(STRANGER, 2, "task.state", {"state": "done"}))
    fake.deliver(event(BOXD, 1, "task.step", {"text": "real"}))
    fake.deliver(event(BOXD, 2, "task.state", {"state": "failed"}))
    assert await asyncio.wait_for(following, 5) == "failed"
    assert [e["data"] for e in shown] == [{"text": "real"}, {"state": "failed"}]


def job_removed(sender: str, job: str) -> Message:
    return signal(
        sender,
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
        "JobRemoved",
        "uoss",
        [7, job, "box-task-x.service", "done"],
    )


def unit_changed(sender: str, unit: str) -> Message:
    return signal(
        sender,
        unit_path(unit),
        "org.freedesktop.DBus.Properties",
        "PropertiesChanged",
        "sa{sv}as",
        ["org.freedesktop.systemd1.Unit", {}, ["ActiveState"]],
    )


async def test_the_manager_ignores_systemd_lookalikes() -> None:
    fake = FakeBus({SYSTEMD_NAME: SYSTEMD, BUS_NAME: BOXD})
    systemd = Systemd(fake.bus)
    await systemd.subscribe()
    changed: list[str] = []
    systemd.watch("box-task-x.service", lambda: changed.append("x"))
    job = "/org/freedesktop/systemd1/job/42"
    done = asyncio.create_task(systemd._job_done(job))
    await asyncio.sleep(0)
    for sender in (STRANGER, BOXD):
        fake.deliver(job_removed(sender, job))
        fake.deliver(unit_changed(sender, "box-task-x.service"))
    await asyncio.sleep(0)
    assert not done.done()
    assert changed == []
    fake.deliver(job_removed(SYSTEMD, job))
    fake.deliver(unit_changed(SYSTEMD, "box-task-x.service"))
    assert await asyncio.wait_for(done, 1) == "done"
    assert changed == ["x"]


def reloading(sender: str, begins: bool = True) -> Message:
    return signal(
        sender,
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
        "Reloading",
        "b",
        [begins],
    )


async def test_only_systemd_reloading_counts_as_a_reload() -> None:
    # A spare's broker started before a reload is replaced as its task starts: a stranger's
    # lookalike would only cost a broker's start, but the count is systemd's alone.
    fake = FakeBus({SYSTEMD_NAME: SYSTEMD, BUS_NAME: BOXD})
    systemd = Systemd(fake.bus)
    await systemd.subscribe()
    fake.deliver(reloading(STRANGER))
    fake.deliver(reloading(BOXD))
    assert systemd.reloads == 0
    fake.deliver(reloading(SYSTEMD))
    assert systemd.reloads == 1


async def test_only_systemd_ending_a_reload_calls_reloaded() -> None:
    # The manager makes its spares again then: a stranger's lookalike must not make it churn.
    fake = FakeBus({SYSTEMD_NAME: SYSTEMD, BUS_NAME: BOXD})
    systemd = Systemd(fake.bus)
    ended: list[int] = []
    systemd.reloaded = lambda: ended.append(systemd.reloads)
    await systemd.subscribe()
    fake.deliver(reloading(STRANGER, begins=False))
    fake.deliver(reloading(SYSTEMD, begins=True))
    assert ended == []
    fake.deliver(reloading(SYSTEMD, begins=False))
    assert ended == [2]


def test_task_objects_wait_for_the_name() -> None:
    """Exporting broadcasts a task's properties; only the name's owner's signals are fenced."""
    fake = FakeBus({})
    records = Records(Store(Path("/nonexistent/box.db")), fake.bus)
    records.export(a_task("t000000001"))
    assert fake.exported == []
    records.publish()
    records.export(a_task("t000000002"))
    assert fake.exported == [task_path("t000000001"), task_path("t000000002")]


def unit_state(unit: str, active: str, sub: str) -> Message:
    return signal(
        SYSTEMD,
        unit_path(unit),
        "org.freedesktop.DBus.Properties",
        "PropertiesChanged",
        "sa{sv}as",
        [
            "org.freedesktop.systemd1.Unit",
            {"ActiveState": Variant("s", active), "SubState": Variant("s", sub)},
            [],
        ],
    )


def service_exit(unit: str, result: str, code: int, status: int) -> Message:
    return signal(
        SYSTEMD,
        unit_path(unit),
        "org.freedesktop.DBus.Properties",
        "PropertiesChanged",
        "sa{sv}as",
        [
            "org.freedesktop.systemd1.Service",
            {
                "Result": Variant("s", result),
                "ExecMainCode": Variant("i", code),
                "ExecMainStatus": Variant("i", status),
            },
            [],
        ],
    )


async def test_the_manager_reads_a_unit_only_for_changes_that_may_be_its_end() -> None:
    """A worker's start announces several changes; each used to cost four calls to read the
    unit while the task's broker and worker were starting. Only a possible end is read."""
    fake = FakeBus({SYSTEMD_NAME: SYSTEMD, BUS_NAME: BOXD})
    systemd = Systemd(fake.bus)
    await systemd.subscribe()
    changed: list[str] = []
    systemd.watch("box-task-x.service", lambda: changed.append("x"))
    unit = "box-task-x.service"
    for message in (
        unit_state(unit, "activating", "start"),
        service_exit(unit, "success", 0, 0),
        unit_state(unit, "active", "running"),
        unit_state(unit, "deactivating", "stop-sigterm"),
    ):
        fake.deliver(message)
    assert changed == []
    ends = (
        unit_state(unit, "active", "exited"),
        unit_state(unit, "inactive", "dead"),
        unit_state(unit, "failed", "failed"),
        service_exit(unit, "success", CLD_EXITED, 0),
        service_exit(unit, "exit-code", 0, 0),
        # Without the values, the unit is read.
        unit_changed(SYSTEMD, unit),
    )
    for message in ends:
        fake.deliver(message)
    assert changed == ["x"] * len(ends)
