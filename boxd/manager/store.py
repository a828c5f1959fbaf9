"""The box's record: one SQLite database (WAL, synchronous=FULL) for tasks, their events,
tokens and settings.

All access runs on one thread of its own: commits wait for fsync, and the event loop must not.
A method returns only after its transaction is on disk.
"""

import asyncio
import json
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from boxd.approval import Approval, ApprovalState
from boxd.event import Event
from boxd.manager import at_rest, journal
from boxd.settings import Settings
from boxd.task import Task, TaskState

T = TypeVar("T")

_SCHEMA = """
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
CREATE TABLE IF NOT EXISTS settings (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    record TEXT NOT NULL
);
"""


class Store:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self._db: sqlite3.Connection | None = None

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def on_thread() -> T:
            if self._db is None:
                raise RuntimeError("the store is not open")
            return work(self._db)

        return await asyncio.get_running_loop().run_in_executor(self._thread, on_thread)

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
            self._db = db

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
    ) -> Event:
        """Writes the task, one event about it, and what the event decides (the answer to a
        key, approvals), in one transaction: all of it is on disk, or none."""

        def write(db: sqlite3.Connection) -> Event:
            with _transaction(db):
                db.execute(
                    "INSERT INTO tasks (id, created, state, record) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (id) DO UPDATE SET state = excluded.state, "
                    "record = excluded.record",
                    (task.id, task.createdAt, task.state.value, task.model_dump_json()),
                )
                event = _append(db, task.id, kind, data)
                if answer is not None:
                    db.execute(
                        "INSERT INTO answers (task, key, result, seq) VALUES (?, ?, ?, ?)",
                        (task.id, answer[0], json.dumps(answer[1]), event.seq),
                    )
                if layer is not None:
                    db.execute(
                        "INSERT INTO layers (workspace, number, task, active) VALUES (?, ?, ?, 1)",
                        (task.workspace, layer, task.id),
                    )
                if drop_layer:
                    db.execute("UPDATE layers SET active = 0 WHERE task = ?", (task.id,))
                for approval in approvals:
                    db.execute(
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
            journal.send(event)
            return event

        return await self._run(write)

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
            with _transaction(db):
                db.execute("UPDATE layers SET active = 0 WHERE workspace = ?", (workspace,))

        await self._run(write)

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
        def read(db: sqlite3.Connection) -> dict[str, Any] | None:
            row = db.execute(
                "SELECT result FROM answers WHERE task = ? AND key = ?", (task_id, key)
            ).fetchone()
            return None if row is None else dict(json.loads(row[0]))

        return await self._run(read)

    async def call_logged(self, task_id: str, key: str) -> bool:
        """Whether a call with this key was begun before (it may have been cut off)."""

        def read(db: sqlite3.Connection) -> bool:
            row = db.execute(
                "SELECT 1 FROM events WHERE task = ? AND kind = 'tool.call' "
                "AND json_extract(data, '$.key') = ? LIMIT 1",
                (task_id, key),
            ).fetchone()
            return row is not None

        return await self._run(read)

    async def approval(self, approval_id: str) -> Approval | None:
        def read(db: sqlite3.Connection) -> Approval | None:
            row = db.execute("SELECT record FROM approvals WHERE id = ?", (approval_id,)).fetchone()
            return None if row is None else Approval.model_validate_json(row[0])

        return await self._run(read)

    async def approvals(
        self, state: ApprovalState | None = None, task_id: str | None = None
    ) -> list[Approval]:
        def read(db: sqlite3.Connection) -> list[Approval]:
            query, values = "SELECT record FROM approvals WHERE 1", []
            if state is not None:
                query += " AND state = ?"
                values.append(state.value)
            if task_id is not None:
                query += " AND task = ?"
                values.append(task_id)
            rows = db.execute(query + " ORDER BY rowid", values).fetchall()
            return [Approval.model_validate_json(row[0]) for row in rows]

        return await self._run(read)

    async def append_event(self, task_id: str, kind: str, data: dict[str, Any]) -> Event:
        def write(db: sqlite3.Connection) -> Event:
            with _transaction(db):
                event = _append(db, task_id, kind, data)
            journal.send(event)
            return event

        return await self._run(write)

    async def task(self, task_id: str) -> Task | None:
        def read(db: sqlite3.Connection) -> Task | None:
            row = db.execute("SELECT record FROM tasks WHERE id = ?", (task_id,)).fetchone()
            return None if row is None else Task.model_validate_json(row[0])

        return await self._run(read)

    async def tasks(self, states: tuple[TaskState, ...] = ()) -> list[Task]:
        def read(db: sqlite3.Connection) -> list[Task]:
            if states:
                marks = ",".join("?" * len(states))
                rows = db.execute(
                    f"SELECT record FROM tasks WHERE state IN ({marks}) ORDER BY created",
                    [s.value for s in states],
                ).fetchall()
            else:
                rows = db.execute("SELECT record FROM tasks ORDER BY created").fetchall()
            return [Task.model_validate_json(row[0]) for row in rows]

        return await self._run(read)

    async def events(self, task_id: str, kind: str | None = None, after: int = 0) -> list[Event]:
        def read(db: sqlite3.Connection) -> list[Event]:
            query = "SELECT seq, task, kind, at, data FROM events WHERE task = ? AND seq > ?"
            values: list[Any] = [task_id, after]
            if kind is not None:
                query += " AND kind = ?"
                values.append(kind)
            return [_event(row) for row in db.execute(query + " ORDER BY seq", values)]

        return await self._run(read)

    # Tokens: only their hashes are kept.

    async def add_token(self, token_hash: str, name: str, role: str, user: str | None) -> None:
        def write(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.execute(
                    "INSERT INTO tokens (hash, name, role, created, user) VALUES (?, ?, ?, ?, ?)",
                    (token_hash, name, role, time.time(), user),
                )

        await self._run(write)

    async def token_role(self, token_hash: str) -> tuple[str, str, str | None] | None:
        """The token's name, role and the account that made it."""

        def read(db: sqlite3.Connection) -> tuple[str, str, str | None] | None:
            row = db.execute(
                "SELECT name, role, user FROM tokens WHERE hash = ?", (token_hash,)
            ).fetchone()
            return None if row is None else (row[0], row[1], row[2])

        return await self._run(read)

    # Settings.

    async def settings(self) -> Settings:
        def read(db: sqlite3.Connection) -> Settings:
            row = db.execute("SELECT record FROM settings WHERE id = 1").fetchone()
            return Settings() if row is None else Settings.model_validate_json(row[0])

        return await self._run(read)

    async def save_settings(self, settings: Settings) -> None:
        def write(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.execute(
                    "INSERT INTO settings (id, record) VALUES (1, ?) "
                    "ON CONFLICT (id) DO UPDATE SET record = excluded.record",
                    (settings.model_dump_json(),),
                )

        await self._run(write)


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT, so a writer never meets a busy upgrade half-way."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        self._db.execute("COMMIT" if error is None else "ROLLBACK")


def _add_column(db: sqlite3.Connection, table: str, column: str, kind: str) -> None:
    """Brings a database made by an older boxd up to date."""
    if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def _append(db: sqlite3.Connection, task_id: str, kind: str, data: dict[str, Any]) -> Event:
    at = time.time()
    text = json.dumps(data, separators=(",", ":"))
    cursor = db.execute(
        "INSERT INTO events (task, kind, at, data) VALUES (?, ?, ?, ?)",
        (task_id, kind, at, text),
    )
    seq = cursor.lastrowid
    assert seq is not None
    return Event(seq=seq, task=task_id, kind=kind, at=at, data=data)


def _event(row: tuple[Any, ...]) -> Event:
    return Event(seq=row[0], task=row[1], kind=row[2], at=row[3], data=json.loads(row[4]))
