"""A step's files are flushed by the manager's store, before the group commit that holds the
step: one syncfs per file system per group, the step answered only after it, and a flush that
fails refusing only the steps whose files it could not flush (a full disk with a 507 in words).

syncfs itself is counted and held through TaskFlush's `sync` seam, on real directories and a
real SQLite file; which writes make a group is decided by holding the store's thread, not by
timing (as in tests/manager/record/test_group_commit.py). D-Bus is a stand-in (nothing listens).
"""

import asyncio
import errno
import json
import os
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest
from dbus_fast.aio import MessageBus

from boxd.errors import BoxError, Problem
from boxd.manager.broker_methods import BrokerMethods
from boxd.manager.record.ledger import TaskSave
from boxd.manager.record.records import Records
from boxd.manager.record.store import Store
from boxd.manager.record.task_flush import STEP_NOT_FLUSHED, TaskFlush
from boxd.wire.caller import Caller, Role
from boxd.wire.event import EventKind
from boxd.wire.models.task import TaskState
from tests.support.broker_methods import QuietBus
from tests.support.held_store import HOLD_SECONDS, arrived, commits, thread_held
from tests.support.tasks import a_task

TASKS = [f"t00000000{n}" for n in range(1, 9)]


@dataclass
class Syncs:
    """The seam for syncfs: what it was called on, in one list with the SQL the store ran."""

    said: list[str]
    fds: list[tuple[int, int]] = field(default_factory=list)
    # Raised for a file system (st_dev) whose flush fails.
    failing: dict[int, OSError] = field(default_factory=dict)
    # When set, syncfs waits for `release` (and sets `entered` first).
    hold: bool = False
    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def __call__(self, fd: int) -> None:
        found = os.fstat(fd)
        self.fds.append((found.st_dev, found.st_ino))
        self.said.append("syncfs")
        if self.hold:
            self.entered.set()
            self.release.wait(HOLD_SECONDS)
        if found.st_dev in self.failing:
            raise self.failing[found.st_dev]


@dataclass
class Box:
    methods: BrokerMethods
    store: Store
    syncs: Syncs
    tasks: Path
    database: Path

    async def step(self, task_id: str, text: str) -> dict[str, object]:
        broker = Caller(Role.BROKER, ":1.7", task=task_id)
        return await self.methods.log_step(broker, task_id, json.dumps({"text": text}))

    async def steps(self, task_id: str) -> list[str]:
        return [str(e.data["text"]) for e in await self.store.events(task_id, EventKind.TASK_STEP)]


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[Box]:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    said: list[str] = []
    syncs = Syncs(said)
    store = Store(tmp_path / "box.db", TaskFlush(tasks, sync=syncs))
    await store.open()
    records = Records(store, cast(MessageBus, QuietBus()))
    for task_id in TASKS:
        (tasks / task_id).mkdir()
        task = a_task(task_id).model_copy(update={"state": TaskState.RUNNING})
        records.export(task)
        await records.record(TaskSave(task, EventKind.TASK_STATE, {"state": "running"}))
    db = store._db
    assert db is not None
    db.set_trace_callback(said.append)
    said.clear()
    yield Box(BrokerMethods(records), store, syncs, tasks, tmp_path / "box.db")
    await store.close()


async def together(box: Box, *steps: tuple[str, str]) -> list[object]:
    """The steps, sent while the store's thread is held, so they make one group."""
    async with thread_held(box.store):
        sent = [asyncio.create_task(box.step(task_id, text)) for task_id, text in steps]
        await arrived(box.store, len(sent))
    return await asyncio.gather(*sent, return_exceptions=True)


async def test_steps_of_tasks_on_one_file_system_cost_one_syncfs_before_the_commit(
    box: Box,
) -> None:
    answers = await together(box, *((task_id, "together") for task_id in TASKS))
    assert all(isinstance(answer, dict) for answer in answers), answers
    # One syncfs for the eight tasks (one file system), before the one transaction that holds
    # all eight steps.
    assert box.syncs.said.count("syncfs") == 1
    assert box.syncs.said.index("syncfs") < box.syncs.said.index("BEGIN IMMEDIATE")
    assert commits(box.syncs.said) == 1
    for task_id in TASKS:
        assert await box.steps(task_id) == ["together"]
    # Alone, each step has a flush of its own.
    for task_id in TASKS[:3]:
        await box.step(task_id, "alone")
    assert box.syncs.said.count("syncfs") == 4


async def test_each_file_system_is_flushed_once_for_the_tasks_on_it(tmp_path: Path) -> None:
    """Unit tests cannot mount, so the 'tasks directory' here is / and its 'tasks' the
    directories there: /proc, /sys and /dev are file systems of their own, /etc and /usr
    usually share the root's."""
    names = ["proc", "sys", "dev", "etc", "usr", "run", "tmp"]
    devices = {name: os.stat(Path("/") / name).st_dev for name in names}
    assert 2 <= len(set(devices.values())) < len(names), devices
    syncs = Syncs([])
    assert TaskFlush(Path("/"), sync=syncs)(names) == {}
    assert sorted(device for device, _ in syncs.fds) == sorted(set(devices.values()))
    # A failing file system refuses the tasks on it, and them alone.
    failing = devices["proc"]
    syncs = Syncs([], failing={failing: OSError(errno.EIO, os.strerror(errno.EIO))})
    failed = TaskFlush(Path("/"), sync=syncs)(names)
    assert set(failed) == {name for name in names if devices[name] == failing}
    assert failed["proc"].problem == Problem.FAILED
    assert failed["proc"].message == (
        "the files of task proc could not be flushed to disk (Input/output error), so the step "
        "was not logged"
    )
    assert len(syncs.fds) == len(set(devices.values()))


async def test_a_step_is_answered_only_after_its_files_are_flushed(box: Box) -> None:
    box.syncs.hold = True
    stepping = asyncio.create_task(box.step(TASKS[0], "held"))
    assert await asyncio.to_thread(box.syncs.entered.wait, HOLD_SECONDS)
    # While syncfs runs, the step is neither answered nor begun in the record.
    await asyncio.sleep(0.05)
    assert not stepping.done()
    assert "BEGIN IMMEDIATE" not in box.syncs.said
    reader = sqlite3.connect(box.database)
    try:
        logged = "SELECT COUNT(*) FROM events WHERE kind = 'task.step'"
        assert reader.execute(logged).fetchone() == (0,)
        box.syncs.release.set()
        answer = await stepping
        assert answer["data"] == {"text": "held", "data": None}
        assert reader.execute(logged).fetchone() == (1,)
    finally:
        box.syncs.release.set()
        reader.close()


async def test_a_step_whose_files_cannot_be_flushed_is_refused_alone(box: Box) -> None:
    """A directory swapped for a link (a task cannot do it: the tasks directory is root's, but
    root still never follows one) and a directory gone: their steps are refused, unlogged; the
    others in the group are logged, and nothing but the good directory's file system is
    flushed."""
    elsewhere = box.tasks.parent / "elsewhere"
    elsewhere.mkdir()
    linked, gone = TASKS[1], TASKS[2]
    os.rmdir(box.tasks / linked)
    os.symlink(elsewhere, box.tasks / linked)
    os.rmdir(box.tasks / gone)
    kept, through_link, missing = await together(
        box, (TASKS[0], "kept"), (linked, "link"), (gone, "gone")
    )
    assert isinstance(kept, dict)
    for refused in (through_link, missing):
        assert isinstance(refused, BoxError) and refused.problem == Problem.FAILED
        assert "could not be flushed to disk" in refused.message
        assert "so the step was not logged" in refused.message
    assert box.syncs.fds == [(box.tasks.stat().st_dev, (box.tasks / TASKS[0]).stat().st_ino)]
    assert commits(box.syncs.said) == 1
    assert await box.steps(TASKS[0]) == ["kept"]
    assert await box.steps(linked) == [] and await box.steps(gone) == []
    # The task's record was not touched either.
    task = await box.store.task(linked)
    assert task is not None and task.step is None


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EDQUOT])
async def test_a_full_disk_refuses_the_step_with_507_in_words(box: Box, number: int) -> None:
    full = OSError(number, os.strerror(number))
    box.syncs.failing = {box.tasks.stat().st_dev: full}
    answers = await together(box, (TASKS[0], "first"), (TASKS[1], "second"))
    for refused in answers:
        assert isinstance(refused, BoxError)
        assert (refused.problem, refused.message) == (Problem.FULL, STEP_NOT_FLUSHED)
        assert refused.problem.http_status == 507
    # Each caller has its own error to raise.
    assert answers[0] is not answers[1]
    assert commits(box.syncs.said) == 0
    assert await box.steps(TASKS[0]) == [] and await box.steps(TASKS[1]) == []
    # Room again: the same step goes through.
    box.syncs.failing = {}
    await box.step(TASKS[0], "first")
    assert await box.steps(TASKS[0]) == ["first"]


async def test_writes_that_ask_for_no_flush_cost_none(box: Box) -> None:
    task = await box.store.task(TASKS[0])
    assert task is not None
    await box.store.append_event(task.id, EventKind.COST, {"cents": 1})
    assert "syncfs" not in box.syncs.said and commits(box.syncs.said) == 1


async def test_a_store_with_no_flush_refuses_a_step_rather_than_skip_its_flush(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "box.db")
    await store.open()
    never: Callable[[object], str] = lambda ledger: "written"  # noqa: E731
    with pytest.raises(RuntimeError, match="no way to flush"):
        await store.transact(never, flush=TASKS[0])
    await store.close()
