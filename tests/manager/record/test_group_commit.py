"""The store's group commit, on a real SQLite file: the writes that arrive while the store's
thread is busy are committed together, in one transaction, each in a savepoint of its own.

The store's thread is held busy by a read that waits for the test, so which writes arrive
together is decided by the test, not by timing; commits are counted from the SQL the
connection runs (sqlite3's trace callback).
"""

import asyncio
import sqlite3
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

import pytest

from boxd.errors import BoxError, Problem
from boxd.manager.record.group_commit import RECORD_FULL
from boxd.manager.record.ledger import Ledger, TaskSave
from boxd.manager.record.store import Store
from boxd.wire.event import EventKind
from boxd.wire.models.event_record import Event
from tests.support.held_store import arrived, commits, thread_held
from tests.support.tasks import a_task


async def opened(path: Path) -> tuple[Store, list[str]]:
    """A store, and the list of the SQL statements it runs from now on."""
    store = Store(path)
    await store.open()
    statements: list[str] = []
    db = store._db
    assert db is not None
    db.set_trace_callback(statements.append)
    return store, statements


async def outcomes(writes: Sequence[Awaitable[Any]]) -> list[Any]:
    return await asyncio.gather(*writes, return_exceptions=True)


async def test_writes_that_arrive_together_commit_together(tmp_path: Path) -> None:
    store, statements = await opened(tmp_path / "box.db")
    tasks = [a_task(f"t00000000{n}") for n in range(1, 9)]
    async with thread_held(store):
        writes = [
            asyncio.create_task(
                store.save_task(TaskSave(t, EventKind.TASK_STATE, {"state": "queued"}))
            )
            for t in tasks
        ]
        await arrived(store, len(writes))
    events = await asyncio.gather(*writes)
    assert commits(statements) == 1
    assert len({event.seq for event in events}) == len(tasks)
    for task, event in zip(tasks, events, strict=True):
        assert event.task == task.id
        assert await store.task(task.id) == task
    # One after another, each write is a group of its own.
    for task in tasks[:3]:
        await store.append_event(task.id, EventKind.TASK_STEP, {"text": "alone"})
    assert commits(statements) == 4
    await store.close()


async def test_each_caller_is_answered_after_the_commit_that_holds_its_write(
    tmp_path: Path,
) -> None:
    store, _ = await opened(tmp_path / "box.db")
    task = a_task()
    await store.save_task(TaskSave(task, EventKind.TASK_STATE, {"state": "queued"}))
    # Another connection, as another process would: it sees committed rows only.
    reader = sqlite3.connect(tmp_path / "box.db")

    async def step(number: int) -> bool:
        event = await store.append_event(task.id, EventKind.TASK_STEP, {"text": str(number)})
        row = reader.execute("SELECT data FROM events WHERE seq = ?", (event.seq,)).fetchone()
        return row is not None

    async with thread_held(store):
        writes = [asyncio.create_task(step(n)) for n in range(5)]
        await arrived(store, len(writes))
    assert await asyncio.gather(*writes) == [True] * 5
    reader.close()
    await store.close()


async def test_a_failing_write_fails_alone_and_keeps_its_own_error(tmp_path: Path) -> None:
    store, statements = await opened(tmp_path / "box.db")
    first, second = a_task("t000000001"), a_task("t000000002")
    await store.add_token("taken", "laptop", "owner", "alice")
    before = commits(statements)
    async with thread_held(store):
        writes = [
            store.save_task(TaskSave(first, EventKind.TASK_STATE, {"state": "queued"})),
            # A record that would not read back (pydantic writes inf as null).
            store.save_task(
                TaskSave(
                    second.model_copy(update={"costCents": float("inf")}),
                    EventKind.TASK_STATE,
                    {"state": "queued"},
                )
            ),
            store.append_event(first.id, EventKind.COST, {"cents": float("nan")}),
            # The same token hash twice: SQLite refuses the row (a constraint, not a full disk).
            store.add_token("taken", "phone", "owner", "alice"),
            store.save_task(TaskSave(second, EventKind.TASK_STATE, {"state": "queued"})),
            store.append_event(first.id, EventKind.TASK_STEP, {"text": "kept"}),
        ]
        answers = asyncio.create_task(outcomes(writes))
        await arrived(store, len(writes))
    saved_first, unreadable, not_finite, duplicate, saved_second, step = await answers
    assert commits(statements) == before + 1
    assert isinstance(saved_first, Event) and isinstance(saved_second, Event)
    assert isinstance(step, Event) and step.data == {"text": "kept"}
    assert isinstance(unreadable, BoxError) and "cannot be recorded" in unreadable.message
    assert isinstance(not_finite, BoxError) and "not finite" in not_finite.message
    assert isinstance(duplicate, sqlite3.IntegrityError)
    # What failed left nothing behind; what went with it is all there.
    assert await store.task(first.id) == first
    assert await store.task(second.id) == second
    assert [e.kind for e in await store.events(first.id)] == ["task.state", "task.step"]
    found = await store.token("taken")
    assert found is not None and found.name == "laptop"
    await store.close()


async def test_a_full_disk_says_so_to_every_caller_of_the_group(tmp_path: Path) -> None:
    """SQLite's max_page_count makes the database full as a full disk would (SQLITE_FULL)."""
    store, statements = await opened(tmp_path / "box.db")
    db = store._db
    assert db is not None
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")
    big = [a_task(f"t00000000{n}").model_copy(update={"prompt": "x" * 50_000}) for n in range(1, 4)]
    async with thread_held(store):
        writes = [
            store.save_task(TaskSave(t, EventKind.TASK_STATE, {"state": "queued"})) for t in big
        ]
        answers = asyncio.create_task(outcomes(writes))
        await arrived(store, len(writes))
    failed = await answers
    for error in failed:
        assert isinstance(error, BoxError)
        assert (error.problem, error.message) == (Problem.FULL, RECORD_FULL)
    # Each caller has its own error to raise, not one shared.
    assert len({id(error) for error in failed}) == len(failed)
    assert commits(statements) == 0
    assert store.reserve_used and not (tmp_path / "box.db-reserve").exists()
    assert not db.in_transaction
    for task in big:
        assert await store.task(task.id) is None
    # Room again: the same writes, together, go through in one commit.
    db.execute("PRAGMA max_page_count = 1073741823")
    async with thread_held(store):
        writes = [
            store.save_task(TaskSave(t, EventKind.TASK_STATE, {"state": "queued"})) for t in big
        ]
        answers = asyncio.create_task(outcomes(writes))
        await arrived(store, len(writes))
    assert all(isinstance(event, Event) for event in await answers)
    assert commits(statements) == 1
    await store.close()


async def test_the_reserve_gives_the_whole_group_its_room(tmp_path: Path) -> None:
    """Full at the first try, the group is tried again once the reserve is given up."""
    store, statements = await opened(tmp_path / "box.db")
    attempts = 0

    def fills_once(db: sqlite3.Connection) -> str:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise OSError(28, "No space left on device")
        return "written"

    task = a_task()
    async with thread_held(store):
        writes = [
            store.save_task(TaskSave(task, EventKind.TASK_STATE, {"state": "queued"})),
            store._write(fills_once),
        ]
        answers = asyncio.create_task(outcomes(writes))
        await arrived(store, len(writes))
    saved, written = await answers
    assert isinstance(saved, Event) and written == "written"
    assert attempts == 2 and commits(statements) == 1
    # Given up for the second try, and made again once the group went through with room left.
    assert (tmp_path / "box.db-reserve").exists() and not store.reserve_used
    assert await store.task(task.id) == task
    await store.close()


async def test_a_caller_that_goes_away_leaves_its_write_and_the_others(tmp_path: Path) -> None:
    store, statements = await opened(tmp_path / "box.db")
    first, second = a_task("t000000001"), a_task("t000000002")
    async with thread_held(store):
        leaving = asyncio.create_task(
            store.save_task(TaskSave(first, EventKind.TASK_STATE, {"state": "queued"}))
        )
        staying = asyncio.create_task(
            store.save_task(TaskSave(second, EventKind.TASK_STATE, {"state": "queued"}))
        )
        await arrived(store, 2)
        leaving.cancel()
    assert isinstance(await staying, Event)
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert commits(statements) == 1
    # Cancelled after it was handed to the store: the write stands, as any sent write would.
    assert await store.task(first.id) == first
    await store.close()


async def test_a_transaction_reads_and_writes_in_one_commit(tmp_path: Path) -> None:
    store, statements = await opened(tmp_path / "box.db")
    task = a_task()
    await store.save_task(TaskSave(task, EventKind.TASK_STATE, {"state": "queued"}))

    def step(ledger: Ledger) -> str:
        found = ledger.task(task.id)
        assert found is not None
        ledger.save_task(
            TaskSave(found.model_copy(update={"step": "one"}), EventKind.TASK_STEP, {})
        )
        ledger.save_task(
            TaskSave(found.model_copy(update={"step": "two"}), EventKind.TASK_STEP, {})
        )
        return "stepped"

    def refuse(ledger: Ledger) -> None:
        found = ledger.task(task.id)
        assert found is not None
        ledger.save_task(TaskSave(found, EventKind.TASK_STEP, {"text": "undone"}))
        raise BoxError(Problem.INVALID, "not now")

    before = commits(statements)
    done, saved = await store.transact(step)
    assert done == "stepped" and [t.step for t, _ in saved] == ["one", "two"]
    assert [e.kind for _, e in saved] == [EventKind.TASK_STEP] * 2
    assert commits(statements) == before + 1
    assert (await store.task(task.id)) == saved[-1][0]
    with pytest.raises(BoxError, match="not now"):
        await store.transact(refuse)
    # What the refused work wrote before it refused is undone.
    assert [e.data for e in await store.events(task.id, EventKind.TASK_STEP)] == [{}, {}]
    await store.close()


async def test_writes_after_close_fail_in_plain_words(tmp_path: Path) -> None:
    store, _ = await opened(tmp_path / "box.db")
    await store.close()
    with pytest.raises(RuntimeError, match="closed"):
        await store.append_event("t000000001", EventKind.TASK_STEP, {"text": "late"})
