"""The box's record: one SQLite database (WAL, synchronous=FULL) for tasks, their events,
tokens and settings. Its tables and their versions are schema.py's.

Its connection, the thread it runs on and the group commit of its writes are GroupCommit's
(group_commit.py)."""

import asyncio
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from boxd.errors import Problem, die
from boxd.manager.access.tokens import TokenRecord
from boxd.manager.record import journal
from boxd.manager.record.group_commit import GroupCommit
from boxd.manager.record.ledger import (
    TASK_COLUMNS,
    TASKS,
    Ledger,
    TaskSave,
    append_event_row,
    approval_of,
    event_of_row,
    task_of_row,
)
from boxd.manager.record.on_disk_version import refuse_newer
from boxd.manager.record.schema import migrate
from boxd.wire.approval import ApprovalState
from boxd.wire.ids import is_task_id
from boxd.wire.models.approval_record import Approval
from boxd.wire.models.event_record import Event
from boxd.wire.models.settings import Settings
from boxd.wire.models.task import Task, TaskState

T = TypeVar("T")


class Store(GroupCommit):
    async def open(self) -> None:
        """Opens the record and brings it to the newest version (schema.py). A record newer than
        this boxd knows is refused (RecordTooNew) before it is opened: not a byte of it, its
        -wal or its -shm changes."""
        await asyncio.to_thread(refuse_newer, self._path)
        path = str(self._path)
        await self._connect(lambda db: migrate(db, path))

    # Tasks and their events.

    async def save_task(self, save: TaskSave) -> Event:
        """Writes the task, one event about it, and what the event decides (the answer to a
        key, approvals), in one transaction: all of it is on disk, or none. A `new` task is
        refused if its id is recorded already (Ledger.save_task)."""

        def write(db: sqlite3.Connection) -> Event:
            return Ledger(db).save_task(save)

        return await self._write(write, journal.send)

    async def transact(
        self, work: Callable[[Ledger], T], flush: str | None = None
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
            return [(int(row[0]), approval_of(row[1], row[2])) for row in rows]

        return await self._run(read)

    async def append_event(self, task_id: str, kind: str, data: dict[str, Any]) -> Event:
        def write(db: sqlite3.Connection) -> Event:
            return append_event_row(db, task_id, kind, data)

        return await self._write(write, journal.send)

    async def task(self, task_id: str) -> Task | None:
        """The task; a record that cannot be read comes back as the task failed, saying so."""

        return await self._run(lambda db: Ledger(db).task(task_id))

    async def tasks(self, states: tuple[TaskState, ...] = ()) -> list[Task]:
        """The tasks, oldest first; a record that cannot be read comes back as the task
        failed, saying so (and is still found by the state its row had)."""

        def read(db: sqlite3.Connection) -> list[Task]:
            query, values = f"SELECT {TASK_COLUMNS} FROM {TASKS}", [s.value for s in states]
            if states:
                query += f" WHERE t.state IN ({','.join('?' * len(states))})"
            rows = db.execute(query + " ORDER BY t.created", values).fetchall()
            return [task for task in map(task_of_row, rows) if task is not None]

        return await self._run(read)

    async def task_rows(self, before: int | None, limit: int) -> list[tuple[int, Task | None]]:
        """Tasks newest first as (row, task), from the row before `before`: pages of ListTasks.
        A row whose id is not a task id is None."""

        def read(db: sqlite3.Connection) -> list[tuple[int, Task | None]]:
            rows = db.execute(
                f"SELECT t.rowid, {TASK_COLUMNS} FROM {TASKS} WHERE t.rowid < ? "
                "ORDER BY t.rowid DESC LIMIT ?",
                (before if before is not None else 2**63 - 1, limit),
            ).fetchall()
            return [(int(row[0]), task_of_row(row[1:])) for row in rows]

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
            return [
                event_of_row(row) for row in db.execute(query + " ORDER BY seq LIMIT ?", values)
            ]

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
