"""The record on a real SQLite file: WAL with synchronous=FULL, tasks with their events."""

import errno
import json
import sqlite3
import time
from pathlib import Path

import pytest

from boxd.errors import BoxError, Problem
from boxd.manager.record import disk, group_commit
from boxd.manager.record.damaged import DAMAGED, DAMAGED_STEP, DAMAGED_TITLE
from boxd.manager.record.disk import RESERVE_BYTES
from boxd.manager.record.group_commit import RECORD_FULL
from boxd.manager.record.ledger import TaskSave, task_id_taken
from boxd.manager.record.store import Store
from boxd.wire.approval import ApprovalState
from boxd.wire.event import EventKind
from boxd.wire.models.approval_record import Approval
from boxd.wire.models.settings import Settings
from boxd.wire.models.task import TaskState
from tests.support.tasks import a_task


async def test_durability_settings(tmp_path: Path) -> None:
    store = Store(tmp_path / "box.db")
    await store.open()
    await store.close()
    db = sqlite3.connect(tmp_path / "box.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_task_and_events(tmp_path: Path) -> None:
    store = Store(tmp_path / "box.db")
    await store.open()
    task = a_task()
    first = await store.save_task(TaskSave(task, EventKind.TASK_STATE, {"state": "queued"}))
    running = task.model_copy(update={"state": TaskState.RUNNING, "step": "one"})
    step = await store.save_task(
        TaskSave(running, EventKind.TASK_STEP, {"text": "one", "data": {"line": 1}})
    )
    assert step.seq > first.seq
    assert await store.task(task.id) == running
    assert [t.id for t in await store.tasks((TaskState.RUNNING,))] == [task.id]
    assert await store.tasks((TaskState.DONE,)) == []
    steps = await store.events(task.id, EventKind.TASK_STEP)
    assert [e.data for e in steps] == [{"text": "one", "data": {"line": 1}}]
    assert [e.kind for e in await store.events(task.id)] == ["task.state", "task.step"]
    assert await store.events(task.id, after=step.seq) == []
    await store.close()

    # A new process sees what the first one acknowledged.
    again = Store(tmp_path / "box.db")
    await again.open()
    assert (await again.task(task.id)) == running
    assert await again.task("t999999999") is None
    await again.close()


async def test_a_new_task_never_takes_the_id_of_a_recorded_one(tmp_path: Path) -> None:
    store = Store(tmp_path / "box.db")
    await store.open()
    first = a_task()
    await store.save_task(TaskSave(first, EventKind.TASK_STATE, {"state": "queued"}, new=True))
    running = first.model_copy(update={"state": TaskState.RUNNING, "step": "one"})
    await store.save_task(TaskSave(running, EventKind.TASK_STEP, {"text": "one", "data": None}))
    # A new task drawn with the same id: before, its save overwrote the running task's record.
    other = a_task().model_copy(update={"title": "another", "prompt": "someone else's"})
    with pytest.raises(BoxError) as refused:
        await store.save_task(TaskSave(other, EventKind.TASK_STATE, {"state": "queued"}, new=True))
    assert refused.value.problem == Problem.FAILED
    assert refused.value.message == task_id_taken(first.id)
    assert await store.task(first.id) == running
    assert [e.kind for e in await store.events(first.id)] == ["task.state", "task.step"]
    # Saves of the task itself still update it.
    done = running.model_copy(update={"state": TaskState.DONE})
    await store.save_task(TaskSave(done, EventKind.TASK_STATE, {"state": "done"}))
    assert await store.task(first.id) == done
    await store.close()


async def test_tokens_and_settings(tmp_path: Path) -> None:
    store = Store(tmp_path / "box.db")
    await store.open()
    assert await store.token("abc") is None
    await store.add_token("abc", "laptop", "owner", "alice")
    found = await store.token("abc")
    assert found is not None
    assert (found.name, found.role, found.user) == ("laptop", "owner", "alice")
    assert await store.settings() == Settings()
    changed = Settings(defaultBudgetCents=7)
    await store.save_settings(changed)
    assert await store.settings() == changed
    await store.close()


async def test_the_agents_pause_outlives_the_process(tmp_path: Path) -> None:
    store = Store(tmp_path / "box.db")
    await store.open()
    assert await store.agents_paused() is False
    await store.save_agents_paused(True)
    await store.save_agents_paused(True)
    await store.close()
    again = Store(tmp_path / "box.db")
    await again.open()
    assert await again.agents_paused() is True
    await again.save_agents_paused(False)
    assert await again.agents_paused() is False
    await again.close()


async def test_calls_logged_by_key(tmp_path: Path) -> None:
    store = Store(tmp_path / "box.db")
    await store.open()
    task = a_task()
    begun = {"key": "line-1", "tool": "echo.say", "input": {"text": "a"}}
    await store.save_task(TaskSave(task, EventKind.TOOL_CALL, begun))
    assert await store.logged_call(task.id, "line-1") == begun
    assert await store.logged_call(task.id, "line-2") is None
    assert await store.logged_call("t000000002", "line-1") is None
    assert await store.answer(task.id, "line-1") is None
    await store.save_task(
        TaskSave(
            task,
            EventKind.TOOL_RESULT,
            {"key": "line-1"},
            answer=("line-1", {"ok": True, "output": 1}),
        )
    )
    assert await store.answer(task.id, "line-1") == {"ok": True, "output": 1}
    await store.close()


async def test_a_damaged_record_reads_as_the_task_failed(tmp_path: Path) -> None:
    store = Store(tmp_path / "box.db")
    await store.open()
    good, nulled, garbage = a_task("t000000001"), a_task("t000000002"), a_task("t000000003")
    for task in (good, nulled, garbage):
        await store.save_task(TaskSave(task, EventKind.TASK_STATE, {"state": "queued"}))
    await store.save_task(TaskSave(good, EventKind.TASK_STEP, {"text": "fine"}))
    db = sqlite3.connect(tmp_path / "box.db")
    # What an infinite cost became on main: pydantic writes inf as null.
    record = nulled.model_dump(mode="json") | {"costCents": None, "title": "kept title"}
    db.execute("UPDATE tasks SET record = ? WHERE id = ?", (json.dumps(record), nulled.id))
    db.execute("UPDATE tasks SET record = 'not json' WHERE id = ?", (garbage.id,))
    db.execute("INSERT INTO tasks VALUES ('../../etc', 0, 'running', '{}')")
    db.execute(
        "INSERT INTO events (task, kind, at, data) VALUES (?, 'task.step', 0, '{oops')",
        (good.id,),
    )
    db.commit()
    db.close()
    tasks = {t.id: t for t in await store.tasks()}
    assert sorted(tasks) == [good.id, nulled.id, garbage.id]
    assert tasks[good.id] == good
    for damaged in (nulled, garbage):
        assert tasks[damaged.id].state == TaskState.FAILED
        assert tasks[damaged.id].error == DAMAGED
    assert tasks[nulled.id].title == "kept title"
    assert tasks[garbage.id].title == DAMAGED_TITLE
    # Still found by the state its row had, so boxd can stop what it left running.
    assert [t.id for t in await store.tasks((TaskState.QUEUED,))] == [
        good.id,
        nulled.id,
        garbage.id,
    ]
    assert sorted(await store.damaged_tasks()) == [(nulled.id, "queued"), (garbage.id, "queued")]
    steps = await store.events(good.id, EventKind.TASK_STEP)
    assert [e.data for e in steps] == [{"text": "fine"}, DAMAGED_STEP]
    await store.close()


async def test_a_record_that_would_not_read_back_is_never_written(tmp_path: Path) -> None:
    store = Store(tmp_path / "box.db")
    await store.open()
    task = a_task()
    await store.save_task(TaskSave(task, EventKind.TASK_STATE, {"state": "queued"}))
    infinite = task.model_copy(update={"costCents": float("inf")})
    with pytest.raises(BoxError, match="cannot be recorded"):
        await store.save_task(TaskSave(infinite, EventKind.COST, {"cents": 1}))
    with pytest.raises(BoxError, match="not finite"):
        await store.save_task(TaskSave(task, EventKind.COST, {"cents": float("nan")}))
    assert await store.task(task.id) == task
    assert [e.kind for e in await store.events(task.id)] == ["task.state"]
    await store.close()


async def test_tasks_come_in_pages_newest_first(tmp_path: Path) -> None:
    store = Store(tmp_path / "box.db")
    await store.open()
    ids = [f"t00000{n:04d}" for n in range(7)]
    for task_id in ids:
        await store.save_task(TaskSave(a_task(task_id), EventKind.TASK_STATE, {"state": "queued"}))
    first = await store.task_rows(None, 3)
    assert [t.id for _, t in first if t] == ids[::-1][:3]
    rest = await store.task_rows(first[-1][0], 10)
    assert [t.id for _, t in rest if t] == ids[::-1][3:]
    await store.close()


async def test_reserving_approvals(tmp_path: Path) -> None:
    """Calls waiting for the owner, or approved and not yet run, keep their cost reserved."""
    store = Store(tmp_path / "box.db")
    await store.open()
    task = a_task()

    def approval(key: str, state: ApprovalState, tool: str | None = "wallet.pay") -> Approval:
        return Approval(
            id=f"{task.id}.{key}",
            task=task.id,
            key=key,
            state=state,
            question="?",
            costCents=10,
            tool=tool,
            askedAt=time.time(),
        )

    asked = (
        approval("waits", ApprovalState.PENDING),
        approval("approved", ApprovalState.APPROVED),
        approval("ran", ApprovalState.APPROVED),
        approval("denied", ApprovalState.DENIED),
        approval("question", ApprovalState.PENDING, tool=None),
    )
    await store.save_task(TaskSave(task, EventKind.APPROVAL, {}, approvals=asked))
    await store.save_task(TaskSave(task, EventKind.TOOL_RESULT, {}, answer=("ran", {"ok": True})))
    reserving = await store.reserving_approvals(task.id)
    assert [a.key for a in reserving] == ["waits", "approved"]
    assert await store.reserving_approvals("t000000002") == []
    await store.close()


async def test_task_uids_are_handed_out_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "box.db")
    await store.open()
    first, last = 0x7000_0000, 0x7000_0004
    someone_elses = {first + 1}
    first_uid = await store.claim_uid("t000000001", first, last, someone_elses.__contains__)
    assert first_uid == first
    # The same task gets the same uid back, as after a restart mid-start.
    assert await store.claim_uid("t000000001", first, last, someone_elses.__contains__) == first
    # A number another account has is skipped.
    assert await store.claim_uid("t000000002", first, last, someone_elses.__contains__) == first + 2
    await store.close()

    # Rows outlive the users: after a restart, numbers go on from the highest ever handed out.
    again = Store(tmp_path / "box.db")
    await again.open()
    assert await again.claim_uid("t000000003", first, last, lambda _: False) == first + 3
    assert await again.claim_uid("t000000004", first, last, lambda _: False) == first + 4
    try:
        await again.claim_uid("t000000005", first, last, lambda _: False)
    except BoxError as error:
        assert "every task user id from 1879048192 to 1879048196" in error.message
    else:
        raise AssertionError("a uid beyond the range was handed out")
    await again.close()


async def test_a_full_disk_uses_the_reserve_once_then_says_so(tmp_path: Path) -> None:
    """SQLite's max_page_count makes the database full as a full disk would (SQLITE_FULL)."""
    store = Store(tmp_path / "box.db")
    await store.open()
    reserve = tmp_path / "box.db-reserve"
    assert reserve.stat().st_size == RESERVE_BYTES
    db = store._db
    assert db is not None
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")
    big = a_task("t000000001").model_copy(update={"prompt": "x" * 100_000})
    # The reserve is given up and the write tried again, still full here: plain words, and
    # nothing half-written.
    with pytest.raises(BoxError) as caught:
        await store.save_task(TaskSave(big, EventKind.TASK_STATE, {"state": "queued"}))
    assert caught.value.message == RECORD_FULL
    assert not reserve.exists() and store.reserve_used
    assert await store.task("t000000001") is None
    assert not db.in_transaction
    # Space again: the next write goes through, and the reserve comes back.
    db.execute("PRAGMA max_page_count = 1073741823")
    await store.save_task(TaskSave(big, EventKind.TASK_STATE, {"state": "queued"}))
    await store.keep_reserve()
    assert reserve.stat().st_size == RESERVE_BYTES and not store.reserve_used
    await store.close()


async def test_the_reserve_comes_back_with_the_first_write_after_space_is_freed(
    tmp_path: Path,
) -> None:
    """No task need end for the box to notice: a write that goes through makes it again."""
    store = Store(tmp_path / "box.db")
    await store.open()
    reserve = tmp_path / "box.db-reserve"
    db = store._db
    assert db is not None
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")
    big = a_task("t000000001").model_copy(update={"prompt": "x" * 100_000})
    with pytest.raises(BoxError) as caught:
        await store.save_task(TaskSave(big, EventKind.TASK_STATE, {"state": "queued"}))
    # The problem a client sees as 507: ask again later, not "your request is wrong".
    assert caught.value.problem == Problem.FULL
    assert not reserve.exists()
    db.execute("PRAGMA max_page_count = 1073741823")
    await store.save_task(TaskSave(big, EventKind.TASK_STATE, {"state": "queued"}))
    assert reserve.stat().st_size == RESERVE_BYTES and not store.reserve_used
    await store.close()


async def test_a_store_opened_on_a_full_disk_makes_its_reserve_once_there_is_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    room = False
    real = disk.make_reserve
    monkeypatch.setattr(group_commit, "make_reserve", lambda path: room and real(path))
    store = Store(tmp_path / "box.db")
    await store.open()
    assert store.reserve_used and not (tmp_path / "box.db-reserve").exists()
    room = True
    await store.save_task(TaskSave(a_task(), EventKind.TASK_STATE, {"state": "queued"}))
    assert (tmp_path / "box.db-reserve").exists() and not store.reserve_used
    await store.close()


async def test_the_reserve_makes_room_for_the_write_that_needs_it(tmp_path: Path) -> None:
    store = Store(tmp_path / "box.db")
    await store.open()
    attempts = 0

    def fills_once(db: sqlite3.Connection) -> str:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return "written"

    assert await store._run(fills_once) == "written"
    assert attempts == 2 and store.reserve_used
    assert not (tmp_path / "box.db-reserve").exists()
    await store.close()


async def test_the_database_and_its_wal_and_shm_are_the_owners_alone(tmp_path: Path) -> None:
    # A database from before, world-readable, and a fresh one: both end 0600, whatever the umask.
    old = tmp_path / "old.db"
    sqlite3.connect(old).execute("PRAGMA journal_mode=WAL").fetchone()
    old.chmod(0o644)
    for path in (old, tmp_path / "new.db"):
        store = Store(path)
        await store.open()
        await store.save_task(TaskSave(a_task(), EventKind.TASK_STATE, {"state": "queued"}))
        files = [path, path.with_name(f"{path.name}-wal"), path.with_name(f"{path.name}-shm")]
        assert {f.name: f.stat().st_mode & 0o777 for f in files} == {f.name: 0o600 for f in files}
        await store.close()


async def test_a_call_line_is_found_by_its_key_through_its_index(tmp_path: Path) -> None:
    """Every call looks up its key's tool.call line: by the index, not by reading every line
    the task logged before, and a damaged line does not fail the lookup of another key."""
    store = Store(tmp_path / "box.db")
    await store.open()
    task = a_task()
    for number in range(20):
        begun = {"key": f"line-{number}", "tool": "echo.say", "input": {"text": "a"}}
        await store.save_task(TaskSave(task, EventKind.TOOL_CALL, begun))
    db = sqlite3.connect(tmp_path / "box.db")
    db.execute(
        "INSERT INTO events (task, kind, at, data) VALUES (?, 'tool.call', 0, '{oops')", (task.id,)
    )
    db.commit()
    statements: list[str] = []
    assert store._db is not None
    store._db.set_trace_callback(statements.append)
    assert await store.logged_call(task.id, "line-7") == {
        "key": "line-7",
        "tool": "echo.say",
        "input": {"text": "a"},
    }
    assert await store.logged_call(task.id, "line-99") is None
    (lookup,) = [s for s in statements if "tool.call" in s][:1]
    plan = " ".join(str(row) for row in db.execute(f"EXPLAIN QUERY PLAN {lookup}"))
    assert "tool_calls_by_key" in plan
    db.close()
    await store.close()


async def test_a_setting_a_stricter_boxd_refuses_takes_its_default_and_the_rest_stay(
    tmp_path: Path,
) -> None:
    """An older boxd took modelBaseUrl over plain http to any host; this one keeps the key off
    the wire. Such a stored setting falls back to its default, without the owner's other
    settings falling with it."""
    store = Store(tmp_path / "box.db")
    await store.open()
    await store.save_settings(Settings(defaultBudgetCents=250, agentFolders=["/srv/work"]))
    db = sqlite3.connect(tmp_path / "box.db")
    record = json.loads(db.execute("SELECT record FROM settings").fetchone()[0])
    record["modelBaseUrl"] = "http://model.example:9090"
    db.execute("UPDATE settings SET record = ?", (json.dumps(record),))
    db.commit()
    db.close()
    settings = await store.settings()
    assert settings.modelBaseUrl == "https://api.anthropic.com"
    assert (settings.defaultBudgetCents, settings.agentFolders) == (250, ["/srv/work"])
    await store.close()
