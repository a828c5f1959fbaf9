"""A step changes the task's step alone (the task_steps row), not its record, which holds the
prompt; every reader sees the latest step, and a save of the whole record takes it back in.
On a real SQLite record through the manager's own LogStep (BrokerMethods.log_step)."""

import json
import sqlite3
from pathlib import Path

import pytest

from boxd.errors import BoxError
from boxd.manager.approval_answers import ApprovalAnswers
from boxd.manager.broker_methods import BrokerMethods
from boxd.manager.record.damaged import DAMAGED
from boxd.manager.record.ledger import Ledger, TaskSave
from boxd.manager.record.store import Store
from boxd.wire.caller import Caller, Role
from boxd.wire.event import EventKind
from boxd.wire.models.task import Task, TaskState
from tests.support.broker_methods import open_methods as open_running
from tests.support.tasks import a_task

BROKER = Caller(Role.BROKER, ":1.7", task="t000000001")
TASK = "t000000001"
LONG = "p" * 100_000


def raw(path: Path) -> tuple[str, list[tuple[str, str]]]:
    """The task's record as stored, and the task_steps rows."""
    db = sqlite3.connect(path)
    try:
        record = db.execute("SELECT record FROM tasks WHERE id = ?", (TASK,)).fetchone()[0]
        steps = db.execute("SELECT task, step FROM task_steps").fetchall()
    finally:
        db.close()
    return str(record), [(str(a), str(b)) for a, b in steps]


async def open_methods(path: Path) -> tuple[BrokerMethods, ApprovalAnswers, Store]:
    """The manager's broker methods on a record with a running task; files flush at once."""
    return await open_running(path, lambda task_ids: {})


async def test_a_step_leaves_the_record_and_every_reader_sees_it(tmp_path: Path) -> None:
    path = tmp_path / "box.db"
    methods, _, store = await open_methods(path)
    long = (await store.task(TASK)) or a_task()
    await methods.records.record(
        TaskSave(
            long.model_copy(update={"prompt": LONG}), EventKind.TASK_STATE, {"state": "running"}
        )
    )
    before, _ = raw(path)
    for number in range(3):
        await methods.log_step(BROKER, TASK, json.dumps({"text": f"step {number}"}))
    record, steps = raw(path)
    assert record == before
    assert steps == [(TASK, "step 2")]
    task = await store.task(TASK)
    assert task is not None and task.step == "step 2" and task.prompt == LONG
    assert [t.step for t in await store.tasks()] == ["step 2"]
    assert [t.step for _, t in await store.task_rows(None, 10) if t is not None] == ["step 2"]
    assert [e.data["text"] for e in await store.events(TASK, EventKind.TASK_STEP)] == [
        "step 0",
        "step 1",
        "step 2",
    ]
    await store.close()
    # On disk: a store opened again reads the same step.
    again = Store(path)
    await again.open()
    task = await again.task(TASK)
    assert task is not None and task.step == "step 2"
    await again.close()


async def test_a_save_of_the_whole_record_takes_the_step_in(tmp_path: Path) -> None:
    path = tmp_path / "box.db"
    methods, _, store = await open_methods(path)
    await methods.log_step(BROKER, TASK, json.dumps({"text": "before the cost"}))
    await methods.log_cost(BROKER, TASK, json.dumps({"cents": 2, "what": "model"}))
    record, steps = raw(path)
    assert json.loads(record)["step"] == "before the cost"
    assert json.loads(record)["costCents"] == 2
    assert steps == []
    await methods.log_step(BROKER, TASK, json.dumps({"text": "after the cost"}))
    task = await store.task(TASK)
    assert task is not None
    assert (task.step, task.costCents) == ("after the cost", 2)
    await store.close()


async def test_a_step_with_another_change_writes_the_whole_record(tmp_path: Path) -> None:
    path = tmp_path / "box.db"
    store = Store(path)
    await store.open()
    await store.save_task(TaskSave(a_task(), EventKind.TASK_STATE, {"state": "queued"}))

    def change(ledger: Ledger) -> None:
        task = ledger.task(TASK)
        assert task is not None
        # Changed in place as well as copied: the save must not take it for a step alone.
        task.state = TaskState.RUNNING
        ledger.save_task(TaskSave(task.model_copy(update={"step": "s"}), EventKind.TASK_STEP, {}))

    await store.transact(change)
    record, steps = raw(path)
    assert (json.loads(record)["state"], json.loads(record)["step"]) == ("running", "s")
    assert steps == []
    task = await store.task(TASK)
    assert task is not None and (task.state, task.step) == (TaskState.RUNNING, "s")
    await store.close()


async def test_a_damaged_record_with_a_later_step_still_reads_as_failed(tmp_path: Path) -> None:
    path = tmp_path / "box.db"
    methods, _, store = await open_methods(path)
    await methods.log_step(BROKER, TASK, json.dumps({"text": "last words"}))
    db = sqlite3.connect(path)
    db.execute("UPDATE tasks SET record = 'not json' WHERE id = ?", (TASK,))
    db.commit()
    db.close()
    task = await store.task(TASK)
    assert isinstance(task, Task)
    assert (task.state, task.error) == (TaskState.FAILED, DAMAGED)
    with pytest.raises(BoxError, match="has ended"):
        await methods.log_step(BROKER, TASK, json.dumps({"text": "more"}))
    await store.close()


async def test_a_step_after_the_task_ended_is_refused_and_not_kept(tmp_path: Path) -> None:
    path = tmp_path / "box.db"
    methods, _, store = await open_methods(path)
    await methods.log_step(BROKER, TASK, json.dumps({"text": "while running"}))
    task = await store.task(TASK)
    assert task is not None
    await methods.records.record(
        TaskSave(
            task.model_copy(update={"state": TaskState.DONE}),
            EventKind.TASK_STATE,
            {"state": "done"},
        )
    )
    with pytest.raises(BoxError, match="has ended"):
        await methods.log_step(BROKER, TASK, json.dumps({"text": "too late"}))
    task = await store.task(TASK)
    assert task is not None and (task.state, task.step) == (TaskState.DONE, "while running")
    assert raw(path)[1] == []
    await store.close()
