"""A task that ends on a full disk (boxd/manager/ending.py `end`): its home, and a failed task's
changes, are gone before its end is recorded, since the record needs the room they may hold;
with room, the order is as it always was. And the disk's own response counts a task's home
with its changes. With a real store, and stand-ins for systemd, useradd and ip."""

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from dbus_fast.aio import MessageBus

from boxd.manager.box import STOPPED, Box
from boxd.manager.record.disk import MIB, stopped_words
from boxd.manager.record.ledger import TaskSave
from boxd.manager.record.store import Store
from boxd.manager.units.systemd import Systemd
from boxd.manager.units.task_os import TaskOS
from boxd.manager.workspaces.layers import THROWN_AWAY
from boxd.paths import task_dir, task_own_home
from boxd.wire.models.task import Task, TaskState
from tests.support.machine_checks import fit_machine
from tests.support.tasks import a_task

TASK = "t000000001"


class FakeSystemd:
    reloads = 0

    def watch(self, name: str, changed: Any) -> None:
        pass

    def unwatch(self, name: str) -> None:
        pass

    async def stop_unit(self, name: str) -> None:
        pass

    async def reset_failed(self, name: str) -> None:
        pass

    async def status(self, name: str) -> None:
        return None


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[Box]:
    async def nothing(*args: Any) -> None:
        return None

    store = Store(tmp_path / "box.db")
    await store.open()
    task_os = TaskOS(remove_user=nothing, remove_netns=nothing)
    made = Box(
        tmp_path,
        store,
        cast(MessageBus, None),
        cast(Systemd, FakeSystemd()),
        task_os,
        check_machine=fit_machine,
    )
    made.layers.open()
    yield made
    await store.close()


async def _running(box: Box, task_id: str = TASK, written: int = 1) -> Task:
    """A running task with `written` MiB in its home and as much in its changes."""
    task = a_task(task_id).model_copy(update={"state": TaskState.RUNNING})
    await box.store.save_task(TaskSave(task, "task.state", {"state": "running"}, new=True))
    box.records.export(task)
    task_dir(box.home, task_id).mkdir(parents=True)
    for folder in (task_own_home(box.home, task_id), box.layers.upper(task_id)):
        (folder / "deep").mkdir(parents=True)
        (folder / "deep" / "file").write_bytes(os.urandom(written * MIB))
        # What a task may leave: a link out, which nothing may follow.
        (folder / "out").symlink_to(box.home / "outside")
    return task


def _watch_the_record(box: Box) -> list[dict[str, bool]]:
    """What was left of the task's files each time its end was recorded."""
    seen: list[dict[str, bool]] = []
    record = box.records.record

    async def watched(save: TaskSave, *args: Any, **kwargs: Any) -> Any:
        task = save.task
        upper = box.layers.upper(task.id)
        seen.append(
            {
                "home": task_own_home(box.home, task.id).exists(),
                "changes": upper.exists() and any(upper.iterdir()),
                "mark": (task_dir(box.home, task.id) / "thrown-away").exists(),
            }
        )
        return await record(save, *args, **kwargs)

    box.records.record = watched  # type: ignore[method-assign]
    return seen


async def test_on_a_full_disk_a_failed_tasks_files_go_before_its_end_is_recorded(
    box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    (box.home / "outside").mkdir()
    (box.home / "outside" / "precious").write_text("not the task's")
    task = await _running(box)
    monkeypatch.setattr(box.task_os, "disk_full", lambda home: True)
    seen = _watch_the_record(box)
    async with box.records.locks[task.id]:
        ended = await box.ending.end(task, TaskState.FAILED, STOPPED)
    await box.ending.cleared(task.id)
    assert (ended.state, ended.error) == (TaskState.FAILED, STOPPED)
    # Recorded with its home and changes gone, the mark left until the end is on disk.
    assert seen == [{"home": False, "changes": False, "mark": True}]
    assert not (task_dir(box.home, task.id) / "thrown-away").exists()
    assert not box.layers.upper(task.id).exists()
    assert (box.home / "outside" / "precious").read_text() == "not the task's"
    stored = await box.store.task(task.id)
    assert stored is not None and stored.state == TaskState.FAILED


async def test_with_room_a_tasks_files_go_once_its_end_is_recorded(
    box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    (box.home / "outside").mkdir()
    task = await _running(box)
    monkeypatch.setattr(box.task_os, "disk_full", lambda home: False)
    seen = _watch_the_record(box)
    async with box.records.locks[task.id]:
        await box.ending.end(task, TaskState.FAILED, STOPPED)
    await box.ending.cleared(task.id)
    assert seen == [{"home": True, "changes": True, "mark": False}]
    assert not task_own_home(box.home, task.id).exists()
    assert not box.layers.upper(task.id).exists()


async def test_a_task_whose_changes_went_before_its_end_was_recorded_does_not_resume(
    box: Box,
) -> None:
    # boxd cut off between throwing the changes away and recording the end: the task's log
    # says it made changes that are gone, so it is not mounted again on an empty upper.
    (box.home / "outside").mkdir()
    task = await _running(box)
    await box.layers.throw_away(task.id)
    assert list((task_dir(box.home, task.id) / "thrown-away").iterdir()) == []
    assert (box.home / "outside").is_dir()
    with pytest.raises(Exception, match=THROWN_AWAY):
        await box.layers.mount(task.id, task.workspace, [], os.getuid())
    # Thrown away twice (the end tried again) is the same.
    await box.layers.throw_away(task.id)
    await box.layers.discard(task.id)
    assert not (task_dir(box.home, task.id) / "thrown-away").exists()


async def test_the_full_disk_stops_the_task_whose_home_takes_the_most(
    box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    (box.home / "outside").mkdir()
    await _running(box, "t000000001", written=1)
    await _running(box, "t000000002", written=1)
    # This one's changes are small; its home is not.
    big = task_own_home(box.home, "t000000002") / "big"
    big.write_bytes(os.urandom(24 * MIB))
    ended: list[tuple[str, str | None]] = []

    async def end(task: Task, state: TaskState, error: str | None, *args: Any) -> Task:
        ended.append((task.id, error))
        return task

    monkeypatch.setattr(box.ending, "end", end)
    await box.ending._free_disk()
    assert ended == [("t000000002", stopped_words(26))]
