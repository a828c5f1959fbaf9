"""The box's record: one SQLite database (WAL, synchronous=FULL) for tasks, their events,
tokens and settings.

All access runs on one thread of its own: commits wait for fsync, and the event loop must not.
A method returns only after its transaction is on disk.

Writes commit in groups: the writes that arrive while a commit is under way are gathered and
committed together, in one transaction and one fsync, each in a SAVEPOINT of its own so one that
fails is undone alone and its caller alone gets the error. Every caller is answered only after
the commit that holds its write.

A write may ask for its task's files to be flushed first (a step: its files are on disk before
its log line is): before the group's BEGIN, the store flushes the file systems of those tasks'
directories, each once (boxd.manager.task_flush), and a write whose files could not be flushed
is refused alone, before it is written. The flush runs on the store's thread, in line with the
commit: a flush thread of its own, tried, overlapped a group's flush with the previous group's
commit but gained nothing (both wait for the same disk's journal) and, free sooner, took
smaller groups: about 0.67 syncfs a step against 0.2 to 0.3 with 20 tasks stepping at once.
"""

import asyncio
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from boxd.errors import BoxError, Problem, die, is_full
from boxd.manager import at_rest, journal
from boxd.manager.damaged import DAMAGED_STEP, salvage
from boxd.manager.disk import give_up_reserve, make_reserve, reserve_path
from boxd.manager.tokens import TokenRecord
from boxd.wire.approval import ApprovalState
from boxd.wire.ids import is_task_id
from boxd.wire.models.approval_record import Approval
from boxd.wire.models.event_record import Event
from boxd.wire.models.settings import Settings
from boxd.wire.models.task import Task, TaskState

T = TypeVar("T")
log = logging.getLogger(__name__)

RECORD_FULL = (
    "The box's disk is full: boxd cannot add to its record until some space is freed "
    "(undo tasks or remove workspaces you no longer need)."
)


def task_id_taken(task_id: str) -> str:
    return (
        f"task id {task_id} is already a recorded task's, so this new task was not recorded "
        "and that task is unchanged: start the new task again (it gets another id)"
    )


class TaskIdTaken(BoxError):
    """A new task's id is a recorded task's: nothing was written."""

    def __init__(self, task_id: str) -> None:
        super().__init__(Problem.FAILED, task_id_taken(task_id))


# A task's row with its latest step (task_steps), as _task reads it.
_TASKS = "tasks t LEFT JOIN task_steps s ON s.task = t.id"
_TASK_COLUMNS = "t.id, t.created, t.record, s.step"

# The key of an event's data, as the index of tool.call lines has it.
_KEY = "json_extract(CASE WHEN json_valid(data) THEN data END, '$.key')"
_SHARES = "json_extract(CASE WHEN json_valid(data) THEN data END, '$.sharesWith')"

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    state TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    task TEXT NOT NULL,
    kind TEXT NOT NULL,
    at REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_task ON events (task, kind, seq);
-- A call's tool.call line by its key, looked up for every call: without it, every call read all
-- the task's earlier ones. A damaged line (not JSON) has no key rather than failing the lookup.
CREATE INDEX IF NOT EXISTS tool_calls_by_key ON events (task, {_KEY}) WHERE kind = 'tool.call';
-- The calls that share a run, by the key of the call that runs: answered with it.
CREATE INDEX IF NOT EXISTS tool_calls_by_shared ON events (task, {_SHARES})
    WHERE kind = 'tool.call';
-- A task's latest step, when it is newer than the step in its record: a step changes this row
-- alone, not the record, which holds the prompt (up to 100,000 characters) and was parsed,
-- copied, written out and checked again for every step. A save of the whole record drops it.
CREATE TABLE IF NOT EXISTS task_steps (
    task TEXT PRIMARY KEY,
    step TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tokens (
    hash TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    created REAL NOT NULL
);
-- The logged result of every answered key, so the same key gets the same result.
CREATE TABLE IF NOT EXISTS answers (
    task TEXT NOT NULL,
    key TEXT NOT NULL,
    result TEXT NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (task, key)
);
CREATE TABLE IF NOT EXISTS approvals (
    id TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    state TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS approvals_by_state ON approvals (state, task);
-- The layers of each workspace's stack, one per done task; undo sets active to 0, and the
-- number is never used again, so a layer's name is its own for good.
CREATE TABLE IF NOT EXISTS layers (
    workspace TEXT NOT NULL,
    number INTEGER NOT NULL,
    task TEXT NOT NULL UNIQUE,
    active INTEGER NOT NULL,
    PRIMARY KEY (workspace, number)
);
-- The uid each task's user was given. Rows stay when the user is removed, so a uid is
-- handed out once, for good: files a task left keep a number no later task gets.
CREATE TABLE IF NOT EXISTS task_uids (
    task TEXT PRIMARY KEY,
    uid INTEGER NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS settings (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    record TEXT NOT NULL
);
-- The model requests a task's gateway forwarded and has not finished, with what they reserve of
-- the task's budget and the broker connection that holds them (boxd.manager.model_requests): a
-- request whose holder is gone is charged what it reserved.
CREATE TABLE IF NOT EXISTS model_requests (
    task TEXT NOT NULL,
    id TEXT NOT NULL,
    holder TEXT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (task, id)
);
-- Whether the owner paused the agents: kept here, not in memory, so a restart keeps the pause.
CREATE TABLE IF NOT EXISTS agents (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    paused INTEGER NOT NULL
);
"""


@dataclass
class _Write(Generic[T]):
    """One write waiting for its group's commit."""

    work: Callable[[sqlite3.Connection], T]
    # Run on the store's thread once the write is on disk and its caller answered (the journal).
    then: Callable[[T], None] | None
    answer: "asyncio.Future[T]"
    # The task whose files are flushed to disk before the write's group begins, if any.
    flush: str | None = None


class _GroupFailed(Exception):
    """What the whole group's transaction met (a full disk, a failed COMMIT): every write in it
    is undone, and every caller gets `error`."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


# Flushes the files of the tasks named, and returns those that could not be, with why.
Flush = Callable[[Iterable[str]], dict[str, BoxError]]


class Store:
    def __init__(self, path: Path, flush: Flush | None = None) -> None:
        """`flush` is what writes that ask for it flush first (boxd.manager.task_flush); a
        store without one refuses them."""
        self._path = path
        self._flush = flush
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self._db: sqlite3.Connection | None = None
        # Writes waiting for the next group commit, and whether one is queued on the thread to
        # take them; both shared by the event loop and the store's thread.
        self._waiting: list[_Write[Any]] = []
        self._commit_queued = False
        self._waiting_lock = threading.Lock()
        # Whether the reserve is missing: given up since it was last made, or never made (boxd
        # started on a full disk).
        self.reserve_used = False
        # Called on the event loop when the reserve is given up.
        self.on_full: Callable[[], None] | None = None

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()

        def on_thread() -> T:
            if self._db is None:
                raise RuntimeError("the store is not open")
            try:
                done = work(self._db)
            except (sqlite3.OperationalError, OSError) as error:
                if not is_full(error):
                    raise
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                # The disk is full: the reserve gives the record room to say so, once.
                self.reserve_used = True
                if give_up_reserve(self._path):
                    log.warning(
                        "The box's disk is full: boxd gave up the space it keeps in reserve "
                        "(%s) to go on recording",
                        reserve_path(self._path),
                    )
                    if self.on_full is not None:
                        loop.call_soon_threadsafe(self.on_full)
                    try:
                        return work(self._db)
                    except (sqlite3.OperationalError, OSError) as again:
                        if not is_full(again):
                            raise
                die(Problem.FULL, RECORD_FULL)
            if self.reserve_used:
                # The record could grow again: space was freed, so the reserve is made again
                # at once, before the disk fills anew, with no task's end needed to notice.
                self._remake_reserve()
            return done

        return await loop.run_in_executor(self._thread, on_thread)

    async def _write(
        self,
        work: Callable[[sqlite3.Connection], T],
        then: Callable[[T], None] | None = None,
        flush: str | None = None,
    ) -> T:
        """Runs `work` in the next group commit and returns its result once that commit is on
        disk; with `flush`, once that task's files are on disk too, flushed before the commit
        began. `work` must not begin or end a transaction of its own: the group's is open."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()
        write = _Write(work, then, answer, flush)
        with self._waiting_lock:
            self._waiting.append(write)
            queue = not self._commit_queued
            self._commit_queued = True
        if queue:
            # One commit queued at a time: the writes that come while it waits or runs go in
            # the one after it.
            try:
                self._thread.submit(self._commit_waiting, loop)
            except RuntimeError:
                # The store was closed: no commit will come for the writes waiting.
                with self._waiting_lock:
                    group, self._waiting = self._waiting, []
                    self._commit_queued = False
                closed = RuntimeError("the store is closed")
                _answer(group, [(None, closed)] * len(group))
        return await answer

    def _commit_waiting(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the store's thread: commits every write waiting now, in one transaction."""
        with self._waiting_lock:
            group, self._waiting = self._waiting, []
            self._commit_queued = False
        try:
            # The files first: a step whose log line is on disk has its files there too.
            refused = self._flush_files(group)
            flushed = [write for write in group if id(write) not in refused]
            committed = iter(self._commit_group(flushed, loop))
            outcomes = [
                (None, refused[id(write)]) if id(write) in refused else next(committed)
                for write in group
            ]
        except Exception as unexpected:
            # Whatever happened, no caller waits for ever.
            log.exception("a group commit failed")
            outcomes = [(None, unexpected)] * len(group)
        # One wake-up of the event loop answers the whole group.
        loop.call_soon_threadsafe(_answer, group, outcomes)
        for write, (value, error) in zip(group, outcomes, strict=True):
            if error is None and write.then is not None:
                try:
                    write.then(value)
                except Exception:
                    log.exception("after a write was committed")

    def _flush_files(self, group: list[_Write[Any]]) -> dict[int, BaseException]:
        """Flushes the files of the tasks the group's writes name, each file system once; the
        writes whose files could not be flushed, by id(), with their refusals."""
        wanted = {write.flush for write in group if write.flush is not None}
        if not wanted:
            return {}
        if self._flush is None:
            missing = RuntimeError("this store was opened with no way to flush tasks' files")
            return {id(write): missing for write in group if write.flush is not None}
        failed = self._flush(wanted)
        return {
            id(write): failed[write.flush]
            for write in group
            if write.flush is not None and write.flush in failed
        }

    def _commit_group(
        self, group: list[_Write[Any]], loop: asyncio.AbstractEventLoop
    ) -> list[tuple[Any, BaseException | None]]:
        """Each write's (result, None) or (None, error)."""
        if not group:
            return []
        if self._db is None:
            return [(None, RuntimeError("the store is not open"))] * len(group)
        try:
            try:
                outcomes = _commit_once(self._db, group)
            except _GroupFailed as failed:
                if not is_full(failed.error):
                    raise
                # The disk is full: the reserve gives the record room to say so, once.
                self.reserve_used = True
                if not give_up_reserve(self._path):
                    raise _GroupFailed(BoxError(Problem.FULL, RECORD_FULL)) from None
                log.warning(
                    "The box's disk is full: boxd gave up the space it keeps in reserve "
                    "(%s) to go on recording",
                    reserve_path(self._path),
                )
                if self.on_full is not None:
                    loop.call_soon_threadsafe(self.on_full)
                try:
                    outcomes = _commit_once(self._db, group)
                except _GroupFailed as again:
                    if is_full(again.error):
                        raise _GroupFailed(BoxError(Problem.FULL, RECORD_FULL)) from None
                    raise
        except _GroupFailed as failed:
            return [(None, failed.error)] * len(group)
        if self.reserve_used:
            # The record could grow again: space was freed, so the reserve is made again
            # at once, before the disk fills anew, with no task's end needed to notice.
            self._remake_reserve()
        return outcomes

    def _remake_reserve(self) -> None:
        try:
            made = make_reserve(self._path)
        except OSError as error:
            log.warning("could not make %s: %s", reserve_path(self._path), error)
            return
        if made and self.reserve_used:
            log.warning("The box's disk has room again: boxd made its reserve again")
        self.reserve_used = not made

    async def keep_reserve(self) -> None:
        """Makes the reserve again once the disk has room for it."""

        def make(db: sqlite3.Connection) -> None:
            self._remake_reserve()

        await self._run(make)

    async def open(self) -> None:
        def connect() -> None:
            # Every prompt, step and tool output is in it: root's alone. SQLite gives the -wal
            # and -shm it makes the database's mode; those of a database from before are closed
            # here too.
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            os.close(os.open(self._path, flags, at_rest.DATABASE))
            for path in (self._path, *(Path(f"{self._path}{end}") for end in ("-wal", "-shm"))):
                if path.exists():
                    at_rest.restrict(path, at_rest.DATABASE)
            db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=5000")
            db.executescript(_SCHEMA)
            _add_column(db, "tokens", "user", "TEXT")
            # An app's or a member's limits, as JSON; a row from before has none (the defaults).
            _add_column(db, "tokens", "limits", "TEXT")
            self._db = db
            self._remake_reserve()

        await asyncio.get_running_loop().run_in_executor(self._thread, connect)

    async def close(self) -> None:
        def disconnect(db: sqlite3.Connection) -> None:
            db.close()
            self._db = None

        if self._db is not None:
            await self._run(disconnect)
        self._thread.shutdown(wait=True)

    # Tasks and their events.

    async def save_task(
        self,
        task: Task,
        kind: str,
        data: dict[str, Any],
        *,
        answer: tuple[str, dict[str, Any]] | None = None,
        approvals: tuple[Approval, ...] = (),
        layer: int | None = None,
        drop_layer: bool = False,
        new: bool = False,
    ) -> Event:
        """Writes the task, one event about it, and what the event decides (the answer to a
        key, approvals), in one transaction: all of it is on disk, or none. A `new` task is
        refused if its id is recorded already (Ledger.save_task)."""

        def write(db: sqlite3.Connection) -> Event:
            return Ledger(db).save_task(
                task,
                kind,
                data,
                answer=answer,
                approvals=approvals,
                layer=layer,
                drop_layer=drop_layer,
                new=new,
            )

        return await self._write(write, journal.send)

    async def transact(
        self, work: Callable[["Ledger"], T], flush: str | None = None
    ) -> tuple[T, list[tuple[Task, Event]]]:
        """Runs `work` on the record in one write (a group commit's savepoint): what it reads and
        what it writes cross to the store's thread once, and no other write comes between.
        Returns its result and the tasks it saved with their events, once on disk. If `work`
        raises (die), nothing it wrote stays. With `flush`, that task's files are flushed to
        disk before the commit begins, and if they cannot be, `work` does not run and the
        refusal is raised."""

        def write(db: sqlite3.Connection) -> tuple[T, list[tuple[Task, Event]]]:
            ledger = Ledger(db)
            return work(ledger), ledger.saved

        def tell_journal(done: tuple[T, list[tuple[Task, Event]]]) -> None:
            for _, event in done[1]:
                journal.send(event)

        return await self._write(write, tell_journal, flush)

    async def stack(self, workspace: str) -> list[tuple[int, str]]:
        """The workspace's layers as (number, task), newest first."""

        def read(db: sqlite3.Connection) -> list[tuple[int, str]]:
            rows = db.execute(
                "SELECT number, task FROM layers WHERE workspace = ? AND active = 1 "
                "ORDER BY number DESC",
                (workspace,),
            ).fetchall()
            return [(int(row[0]), str(row[1])) for row in rows]

        return await self._run(read)

    async def drop_workspace_layers(self, workspace: str) -> None:
        """A removed workspace's layers leave every stack, so a new one of that name is new."""

        def write(db: sqlite3.Connection) -> None:
            db.execute("UPDATE layers SET active = 0 WHERE workspace = ?", (workspace,))

        await self._write(write)

    async def dropped_layers(self, workspace: str) -> list[tuple[int, str]]:
        """Layers that left the workspace's stack (undone or kept) whose files may remain, as
        (number, task)."""

        def read(db: sqlite3.Connection) -> list[tuple[int, str]]:
            rows = db.execute(
                "SELECT number, task FROM layers WHERE workspace = ? AND active = 0",
                (workspace,),
            ).fetchall()
            return [(int(row[0]), str(row[1])) for row in rows]

        return await self._run(read)

    async def next_layer(self, workspace: str) -> int:
        def read(db: sqlite3.Connection) -> int:
            row = db.execute(
                "SELECT COALESCE(MAX(number), 0) + 1 FROM layers WHERE workspace = ?", (workspace,)
            ).fetchone()
            return int(row[0])

        return await self._run(read)

    async def layer_of(self, task_id: str) -> tuple[int, bool] | None:
        """The task's layer number and whether it is in its workspace's stack."""

        def read(db: sqlite3.Connection) -> tuple[int, bool] | None:
            row = db.execute(
                "SELECT number, active FROM layers WHERE task = ?", (task_id,)
            ).fetchone()
            return None if row is None else (int(row[0]), bool(row[1]))

        return await self._run(read)

    async def answer(self, task_id: str, key: str) -> dict[str, Any] | None:
        return await self._run(lambda db: Ledger(db).answer(task_id, key))

    async def logged_call(self, task_id: str, key: str) -> dict[str, Any] | None:
        return await self._run(lambda db: Ledger(db).logged_call(task_id, key))

    async def reserving_approvals(self, task_id: str) -> list[Approval]:
        return await self._run(lambda db: Ledger(db).reserving_approvals(task_id))

    async def approval(self, approval_id: str) -> Approval | None:
        return await self._run(lambda db: Ledger(db).approval(approval_id))

    async def model_requests(self, task_id: str) -> list[tuple[str, str, dict[str, Any]]]:
        return await self._run(lambda db: Ledger(db).model_requests(task_id))

    async def tasks_with_model_requests(self) -> list[str]:
        """The tasks that have model requests open (boxd.manager.model_requests)."""

        def read(db: sqlite3.Connection) -> list[str]:
            rows = db.execute("SELECT DISTINCT task FROM model_requests ORDER BY task").fetchall()
            return [str(row[0]) for row in rows]

        return await self._run(read)

    async def approvals(
        self, state: ApprovalState | None = None, task_id: str | None = None
    ) -> list[Approval]:
        rows = await self.approval_rows(state, task_id)
        return [found for _, found in rows if found is not None]

    async def approval_rows(
        self,
        state: ApprovalState | None = None,
        task_id: str | None = None,
        after: int = 0,
        limit: int = -1,
    ) -> list[tuple[int, Approval | None]]:
        """Approvals in the order asked, as (row, approval), from the row after `after`. A
        record that cannot be read is None, and logged."""

        def read(db: sqlite3.Connection) -> list[tuple[int, Approval | None]]:
            query = "SELECT rowid, id, record FROM approvals WHERE rowid > ?"
            values: list[Any] = [after]
            if state is not None:
                query += " AND state = ?"
                values.append(state.value)
            if task_id is not None:
                query += " AND task = ?"
                values.append(task_id)
            values.append(limit)
            rows = db.execute(query + " ORDER BY rowid LIMIT ?", values).fetchall()
            return [(int(row[0]), _approval(row[1], row[2])) for row in rows]

        return await self._run(read)

    async def append_event(self, task_id: str, kind: str, data: dict[str, Any]) -> Event:
        def write(db: sqlite3.Connection) -> Event:
            return _append(db, task_id, kind, data)

        return await self._write(write, journal.send)

    async def task(self, task_id: str) -> Task | None:
        """The task; a record that cannot be read comes back as the task failed, saying so."""

        return await self._run(lambda db: Ledger(db).task(task_id))

    async def tasks(self, states: tuple[TaskState, ...] = ()) -> list[Task]:
        """The tasks, oldest first; a record that cannot be read comes back as the task
        failed, saying so (and is still found by the state its row had)."""

        def read(db: sqlite3.Connection) -> list[Task]:
            query, values = f"SELECT {_TASK_COLUMNS} FROM {_TASKS}", [s.value for s in states]
            if states:
                query += f" WHERE t.state IN ({','.join('?' * len(states))})"
            rows = db.execute(query + " ORDER BY t.created", values).fetchall()
            return [task for task in map(_task, rows) if task is not None]

        return await self._run(read)

    async def task_rows(self, before: int | None, limit: int) -> list[tuple[int, Task | None]]:
        """Tasks newest first as (row, task), from the row before `before`: pages of ListTasks.
        A row whose id is not a task id is None."""

        def read(db: sqlite3.Connection) -> list[tuple[int, Task | None]]:
            rows = db.execute(
                f"SELECT t.rowid, {_TASK_COLUMNS} FROM {_TASKS} WHERE t.rowid < ? "
                "ORDER BY t.rowid DESC LIMIT ?",
                (before if before is not None else 2**63 - 1, limit),
            ).fetchall()
            return [(int(row[0]), _task(row[1:])) for row in rows]

        return await self._run(read)

    async def damaged_tasks(self) -> list[tuple[str, str]]:
        """Tasks whose records cannot be read, as (id, state of their row)."""

        def read(db: sqlite3.Connection) -> list[tuple[str, str]]:
            found = []
            for task_id, state, record in db.execute("SELECT id, state, record FROM tasks"):
                if not isinstance(task_id, str) or not is_task_id(task_id):
                    continue
                try:
                    Task.model_validate_json(record)
                except (ValidationError, ValueError, TypeError):
                    found.append((str(task_id), str(state)))
            return found

        return await self._run(read)

    async def events(
        self, task_id: str, kind: str | None = None, after: int = 0, limit: int = -1
    ) -> list[Event]:
        def read(db: sqlite3.Connection) -> list[Event]:
            query = "SELECT seq, task, kind, at, data FROM events WHERE task = ? AND seq > ?"
            values: list[Any] = [task_id, after]
            if kind is not None:
                query += " AND kind = ?"
                values.append(kind)
            values.append(limit)
            return [_event(row) for row in db.execute(query + " ORDER BY seq LIMIT ?", values)]

        return await self._run(read)

    # Task users' uids.

    async def claim_uid(
        self, task_id: str, first: int, last: int, taken: Callable[[int], bool]
    ) -> int:
        """The task's uid: the one it was given before, or the next never handed out from
        first..last that `taken` does not say another account already has."""

        def write(db: sqlite3.Connection) -> int:
            row = db.execute("SELECT uid FROM task_uids WHERE task = ?", (task_id,)).fetchone()
            if row is not None:
                return int(row[0])
            row = db.execute(
                "SELECT MAX(uid) FROM task_uids WHERE uid BETWEEN ? AND ?", (first, last)
            ).fetchone()
            uid = first if row[0] is None else int(row[0]) + 1
            while uid <= last and taken(uid):
                uid += 1
            if uid > last:
                die(
                    Problem.FAILED,
                    f"this box has handed out every task user id from {first} to {last}: "
                    "no new task can start",
                )
            db.execute("INSERT INTO task_uids (task, uid) VALUES (?, ?)", (task_id, uid))
            return uid

        return await self._write(write)

    # Tokens: only their hashes are kept.

    async def add_token(
        self, token_hash: str, name: str, role: str, user: str | None, limits: str | None = None
    ) -> None:
        def write(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO tokens (hash, name, role, created, user, limits) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (token_hash, name, role, time.time(), user, limits),
            )

        await self._write(write)

    async def token(self, token_hash: str) -> TokenRecord | None:
        def read(db: sqlite3.Connection) -> TokenRecord | None:
            row = db.execute(
                "SELECT hash, name, role, created, user, limits FROM tokens WHERE hash = ?",
                (token_hash,),
            ).fetchone()
            return None if row is None else TokenRecord(*row)

        return await self._run(read)

    async def tokens(self) -> list[TokenRecord]:
        def read(db: sqlite3.Connection) -> list[TokenRecord]:
            rows = db.execute(
                "SELECT hash, name, role, created, user, limits FROM tokens ORDER BY created"
            )
            return [TokenRecord(*row) for row in rows]

        return await self._run(read)

    async def remove_token(self, token_hash: str) -> None:
        def write(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM tokens WHERE hash = ?", (token_hash,))

        await self._write(write)

    # Settings.

    async def settings(self) -> Settings:
        return await self._run(lambda db: Ledger(db).settings())

    async def save_settings(self, settings: Settings) -> None:
        def write(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO settings (id, record) VALUES (1, ?) "
                "ON CONFLICT (id) DO UPDATE SET record = excluded.record",
                (settings.model_dump_json(),),
            )

        await self._write(write)

    # The agents' pause.

    async def agents_paused(self) -> bool:
        def read(db: sqlite3.Connection) -> bool:
            row = db.execute("SELECT paused FROM agents WHERE id = 1").fetchone()
            return row is not None and bool(row[0])

        return await self._run(read)

    async def save_agents_paused(self, paused: bool) -> None:
        def write(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO agents (id, paused) VALUES (1, ?) "
                "ON CONFLICT (id) DO UPDATE SET paused = excluded.paused",
                (int(paused),),
            )

        await self._write(write)


class Ledger:
    """The record as read and written on the store's thread, in the transaction open on its
    connection: what Store's methods do, and what Store.transact's work does in one go."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        # The tasks saved here, with their events, in order.
        self.saved: list[tuple[Task, Event]] = []
        # The fields of each task as last read or saved here: what a save compares with, to
        # write a step alone. A shallow copy: a field given a new value differs, and the task's
        # lists and models are never changed in place (a change is a model_copy or a new value).
        self._read: dict[str, dict[str, Any]] = {}

    def task(self, task_id: str) -> Task | None:
        """The task; a record that cannot be read comes back as the task failed, saying so."""
        row = self._db.execute(
            f"SELECT {_TASK_COLUMNS} FROM {_TASKS} WHERE t.id = ?", (task_id,)
        ).fetchone()
        task = None if row is None else _task(row)
        if task is not None:
            self._read[task_id] = dict(task.__dict__)
        return task

    def answer(self, task_id: str, key: str) -> dict[str, Any] | None:
        row = self._db.execute(
            "SELECT result FROM answers WHERE task = ? AND key = ?", (task_id, key)
        ).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def logged_call(self, task_id: str, key: str) -> dict[str, Any] | None:
        """The `tool.call` line of the key's call, if one was begun (it may have been cut off)."""
        row = self._db.execute(
            "SELECT data FROM events WHERE task = ? AND kind = 'tool.call' "
            f"AND {_KEY} = ? ORDER BY seq LIMIT 1",
            (task_id, key),
        ).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def sharing(self, task_id: str, key: str) -> list[str]:
        """The keys of the calls begun to share the run of `key`'s call, in the order they came."""
        rows = self._db.execute(
            f"SELECT {_KEY} FROM events WHERE task = ? AND kind = 'tool.call' "
            f"AND {_SHARES} = ? ORDER BY seq",
            (task_id, key),
        ).fetchall()
        return [str(row[0]) for row in rows if isinstance(row[0], str)]

    def reserving_approvals(self, task_id: str) -> list[Approval]:
        """The task's approvals of calls whose cost is reserved: waiting for the owner, or
        approved and not yet run (no answer logged for their key)."""
        rows = self._db.execute(
            "SELECT a.id, a.record FROM approvals a "
            "WHERE a.state IN ('pending', 'approved') AND a.task = ? "
            "AND json_extract(a.record, '$.tool') IS NOT NULL "
            "AND (a.state = 'pending' OR NOT EXISTS (SELECT 1 FROM answers n "
            "WHERE n.task = a.task AND n.key = json_extract(a.record, '$.key'))) "
            "ORDER BY a.rowid",
            (task_id,),
        ).fetchall()
        found = (_approval(row[0], row[1]) for row in rows)
        return [approval for approval in found if approval is not None]

    def model_requests(self, task_id: str) -> list[tuple[str, str, dict[str, Any]]]:
        """The task's open model requests as (id, holder, record), in the order begun."""
        rows = self._db.execute(
            "SELECT id, holder, record FROM model_requests WHERE task = ? ORDER BY rowid",
            (task_id,),
        ).fetchall()
        return [(str(row[0]), str(row[1]), dict(json.loads(row[2]))) for row in rows]

    def put_model_request(
        self, task_id: str, request_id: str, holder: str, record: dict[str, Any]
    ) -> None:
        self._db.execute(
            "INSERT INTO model_requests (task, id, holder, record) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (task, id) DO UPDATE SET record = excluded.record",
            (task_id, request_id, holder, json.dumps(record)),
        )

    def drop_model_request(self, task_id: str, request_id: str) -> None:
        self._db.execute(
            "DELETE FROM model_requests WHERE task = ? AND id = ?", (task_id, request_id)
        )

    def approval(self, approval_id: str) -> Approval | None:
        row = self._db.execute(
            "SELECT id, record FROM approvals WHERE id = ?", (approval_id,)
        ).fetchone()
        return None if row is None else _approval(row[0], row[1])

    def settings(self) -> Settings:
        row = self._db.execute("SELECT record FROM settings WHERE id = 1").fetchone()
        if row is None:
            return Settings()
        try:
            return Settings.model_validate_json(row[0])
        except ValidationError as error:
            kept = _settings_kept(row[0], error)
            if kept is not None:
                return kept
            log.error("the settings in box.db are damaged, so the defaults apply: %s", error)
            return Settings()
        except (ValueError, TypeError) as error:
            log.error("the settings in box.db are damaged, so the defaults apply: %s", error)
            return Settings()

    def save_task(
        self,
        task: Task,
        kind: str,
        data: dict[str, Any],
        *,
        answer: tuple[str, dict[str, Any]] | None = None,
        approvals: tuple[Approval, ...] = (),
        layer: int | None = None,
        drop_layer: bool = False,
        new: bool = False,
    ) -> Event:
        """Writes the task, one event about it, and what the event decides (the answer to a
        key, approvals); in a transaction, so all of it is on disk, or none. A `new` task's id
        must be no recorded task's: its save never overwrites another task's record. A save
        that changes nothing but the task's step (every step) writes the step alone."""
        if not new and task.step is not None and _step_alone(self._read.get(task.id), task):
            self._db.execute(
                "INSERT INTO task_steps (task, step) VALUES (?, ?) "
                "ON CONFLICT (task) DO UPDATE SET step = excluded.step",
                (task.id, task.step),
            )
        else:
            self._save_record(task, new)
        self._read[task.id] = dict(task.__dict__)
        event = _append(self._db, task.id, kind, data)
        if answer is not None:
            self._db.execute(
                "INSERT INTO answers (task, key, result, seq) VALUES (?, ?, ?, ?)",
                (task.id, answer[0], json.dumps(answer[1]), event.seq),
            )
        if layer is not None:
            self._db.execute(
                "INSERT INTO layers (workspace, number, task, active) VALUES (?, ?, ?, 1)",
                (task.workspace, layer, task.id),
            )
        if drop_layer:
            self._db.execute("UPDATE layers SET active = 0 WHERE task = ?", (task.id,))
        for approval in approvals:
            self._db.execute(
                "INSERT INTO approvals (id, task, state, record) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET state = excluded.state, "
                "record = excluded.record",
                (
                    approval.id,
                    approval.task,
                    approval.state.value,
                    approval.model_dump_json(),
                ),
            )
        self.saved.append((task, event))
        return event

    def _save_record(self, task: Task, new: bool) -> None:
        """Writes the task's whole record; its step is the record's again."""
        record = _readable(task)
        if new:
            try:
                self._db.execute(
                    "INSERT INTO tasks (id, created, state, record) VALUES (?, ?, ?, ?)",
                    (task.id, task.createdAt, task.state.value, record),
                )
            except sqlite3.IntegrityError:
                raise TaskIdTaken(task.id) from None
        else:
            self._db.execute(
                "INSERT INTO tasks (id, created, state, record) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET state = excluded.state, "
                "record = excluded.record",
                (task.id, task.createdAt, task.state.value, record),
            )
        self._db.execute("DELETE FROM task_steps WHERE task = ?", (task.id,))


def _step_alone(before: dict[str, Any] | None, after: Task) -> bool:
    """Whether `after` is the task whose fields were `before` with another step and nothing
    else. Fields are compared by identity first (a model_copy shares them), so a long prompt is
    not compared character by character."""
    return before is not None and after.__dict__ == {**before, "step": after.step}


def _commit_once(
    db: sqlite3.Connection, group: list[_Write[Any]]
) -> list[tuple[Any, BaseException | None]]:
    """One transaction for the group, a SAVEPOINT for each write: a write that raises is rolled
    back alone and keeps its error; one that meets a full disk, or that SQLite answered by
    rolling back the whole transaction, fails the group (_GroupFailed)."""
    outcomes: list[tuple[Any, BaseException | None]] = []
    try:
        db.execute("BEGIN IMMEDIATE")
        for write in group:
            db.execute("SAVEPOINT write")
            try:
                value = write.work(db)
            except Exception as error:
                if is_full(error) or not db.in_transaction:
                    raise
                db.execute("ROLLBACK TO write")
                db.execute("RELEASE write")
                outcomes.append((None, error))
            else:
                db.execute("RELEASE write")
                outcomes.append((value, None))
        db.execute("COMMIT")
    except Exception as error:
        # SQLite rolls back by itself on some errors (SQLITE_FULL among them); a second
        # ROLLBACK would fail and hide the first error.
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise _GroupFailed(error) from error
    return outcomes


def _answer(group: list[_Write[Any]], outcomes: list[tuple[Any, BaseException | None]]) -> None:
    """On the event loop: every caller of the group gets its own outcome."""
    for write, (value, error) in zip(group, outcomes, strict=True):
        if write.answer.done():
            # The caller went away (cancelled); its write stands.
            continue
        if error is None:
            write.answer.set_result(value)
        elif isinstance(error, BoxError):
            # Each caller raises its own, so one's traceback is not added to another's.
            write.answer.set_exception(BoxError(error.problem, error.message))
        else:
            write.answer.set_exception(error)


def _settings_kept(record: str, error: ValidationError) -> Settings | None:
    """The stored settings without the ones this boxd refuses (a rule made stricter since they
    were saved: an http modelBaseUrl to another machine), which take their defaults; the rest
    are kept. None if that does not make them valid."""
    try:
        stored = json.loads(record)
    except ValueError:
        return None
    refused = {str(problem["loc"][0]) for problem in error.errors() if problem["loc"]}
    if not isinstance(stored, dict) or not refused:
        return None
    try:
        kept = Settings.model_validate({k: v for k, v in stored.items() if k not in refused})
    except ValidationError:
        return None
    log.warning(
        "the stored settings %s are no longer accepted, so their defaults apply: %s",
        ", ".join(sorted(refused)),
        error,
    )
    return kept


def _add_column(db: sqlite3.Connection, table: str, column: str, kind: str) -> None:
    """Brings a database made by an older boxd up to date."""
    if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def _readable(task: Task) -> str:
    """The task's record, once it is known to read back: a value that would not (an infinity,
    which pydantic writes as null) is refused before it reaches the disk."""
    record = task.model_dump_json()
    try:
        Task.model_validate_json(record)
    except ValidationError as error:
        die(Problem.INVALID, f"task {task.id} cannot be recorded as it is: {error}")
    return record


def _task(row: tuple[Any, ...]) -> Task | None:
    """The task of a row of _TASK_COLUMNS."""
    task_id, created, record, step = row
    if not isinstance(task_id, str) or not is_task_id(task_id):
        log.error("box.db holds a task row whose id %r is not a task id; it is left out", task_id)
        return None
    try:
        task = Task.model_validate_json(record)
    except (ValidationError, ValueError, TypeError) as error:
        return salvage(task_id, created, record, error)
    if isinstance(step, str):
        task.step = step
    return task


def _approval(approval_id: Any, record: Any) -> Approval | None:
    try:
        return Approval.model_validate_json(record)
    except (ValidationError, ValueError, TypeError) as error:
        log.error(
            "the record of approval %r in box.db is damaged and left out: %s", approval_id, error
        )
        return None


def _append(db: sqlite3.Connection, task_id: str, kind: str, data: dict[str, Any]) -> Event:
    at = time.time()
    try:
        text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    except ValueError:
        die(Problem.INVALID, f"a {kind} event of task {task_id} holds a number that is not finite")
    cursor = db.execute(
        "INSERT INTO events (task, kind, at, data) VALUES (?, ?, ?, ?)",
        (task_id, kind, at, text),
    )
    seq = cursor.lastrowid
    assert seq is not None
    return Event(seq=seq, task=task_id, kind=kind, at=at, data=data)


def _event(row: tuple[Any, ...]) -> Event:
    try:
        data = json.loads(row[4])
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (ValueError, TypeError) as error:
        log.error("event %s of task %s in box.db is damaged: %s", row[0], row[1], error)
        data = dict(DAMAGED_STEP)
    return Event(seq=row[0], task=row[1], kind=row[2], at=row[3], data=data)
