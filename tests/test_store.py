"""The record on a real SQLite file: WAL with synchronous=FULL, tasks with their events."""

import sqlite3
import time
from pathlib import Path

from boxd.event import EventKind
from boxd.manager.store import Store
from boxd.settings import Settings
from boxd.task import Task, TaskState


def a_task(task_id: str = "t000000001") -> Task:
    return Task(
        id=task_id,
        title="t",
        prompt="step a",
        state=TaskState.QUEUED,
        user=f"box-{task_id}",
        workspace="home",
        worker="fake",
        tools=[],
        hosts=[],
        source="api",
        budgetCents=100,
        createdAt=time.time(),
    )


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
    first = await store.save_task(task, EventKind.TASK_STATE, {"state": "queued"})
    running = task.model_copy(update={"state": TaskState.RUNNING, "step": "one"})
    step = await store.save_task(running, EventKind.TASK_STEP, {"text": "one", "data": {"line": 1}})
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


async def test_tokens_and_settings(tmp_path: Path) -> None:
    store = Store(tmp_path / "box.db")
    await store.open()
    assert await store.token_role("abc") is None
    await store.add_token("abc", "laptop", "owner", "alice")
    assert await store.token_role("abc") == ("laptop", "owner", "alice")
    assert await store.settings() == Settings()
    changed = Settings(defaultBudgetCents=7)
    await store.save_settings(changed)
    assert await store.settings() == changed
    await store.close()


async def test_calls_logged_by_key(tmp_path: Path) -> None:
    store = Store(tmp_path / "box.db")
    await store.open()
    task = a_task()
    await store.save_task(task, EventKind.TOOL_CALL, {"key": "line-1", "tool": "echo.say"})
    assert await store.call_logged(task.id, "line-1")
    assert not await store.call_logged(task.id, "line-2")
    assert not await store.call_logged("t000000002", "line-1")
    assert await store.answer(task.id, "line-1") is None
    await store.save_task(
        task, EventKind.TOOL_RESULT, {"key": "line-1"}, answer=("line-1", {"ok": True, "output": 1})
    )
    assert await store.answer(task.id, "line-1") == {"ok": True, "output": 1}
    await store.close()


async def test_the_database_and_its_wal_and_shm_are_the_owners_alone(tmp_path: Path) -> None:
    # A database from before, world-readable, and a fresh one: both end 0600, whatever the umask.
    old = tmp_path / "old.db"
    sqlite3.connect(old).execute("PRAGMA journal_mode=WAL").fetchone()
    old.chmod(0o644)
    for path in (old, tmp_path / "new.db"):
        store = Store(path)
        await store.open()
        await store.save_task(a_task(), EventKind.TASK_STATE, {"state": "queued"})
        files = [path, path.with_name(f"{path.name}-wal"), path.with_name(f"{path.name}-shm")]
        assert {f.name: f.stat().st_mode & 0o777 for f in files} == {f.name: 0o600 for f in files}
        await store.close()
