"""The record as read and written in one transaction on the store's thread (`Ledger`), and the
codecs of its rows: what Store's methods do, and what `Store.transact`'s work does in one go.
The connection, its thread and the group commit are boxd.manager.record.group_commit's."""

import json
import logging
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from boxd.errors import BoxError, Problem, die
from boxd.manager.record.damaged import DAMAGED_STEP, salvage
from boxd.wire.ids import is_task_id
from boxd.wire.models.approval_record import Approval
from boxd.wire.models.event_record import Event
from boxd.wire.models.settings import Settings
from boxd.wire.models.task import Task

log = logging.getLogger(__name__)


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
TASKS = "tasks t LEFT JOIN task_steps s ON s.task = t.id"
TASK_COLUMNS = "t.id, t.created, t.record, s.step"

# The key of an event's data, as the index of tool.call lines has it.
EVENT_KEY = "json_extract(CASE WHEN json_valid(data) THEN data END, '$.key')"
SHARES_WITH = "json_extract(CASE WHEN json_valid(data) THEN data END, '$.sharesWith')"


@dataclass(frozen=True)
class TaskSave:
    """A task, one event about it, and what the event decides, written together by
    Ledger.save_task, passed whole from Records and the Store."""

    task: Task
    kind: str
    data: dict[str, Any]
    # The answer to a key: the key and its result.
    answer: tuple[str, dict[str, Any]] | None = None
    approvals: tuple[Approval, ...] = ()
    # The task's layer of its workspace, from now on; or its layer no longer active.
    layer: int | None = None
    drop_layer: bool = False
    # A new task's id must be no recorded task's: its save never overwrites another's record.
    new: bool = False


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
            f"SELECT {TASK_COLUMNS} FROM {TASKS} WHERE t.id = ?", (task_id,)
        ).fetchone()
        task = None if row is None else task_of_row(row)
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
            f"AND {EVENT_KEY} = ? ORDER BY seq LIMIT 1",
            (task_id, key),
        ).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def sharing(self, task_id: str, key: str) -> list[str]:
        """The keys of the calls begun to share the run of `key`'s call, in the order they came."""
        rows = self._db.execute(
            f"SELECT {EVENT_KEY} FROM events WHERE task = ? AND kind = 'tool.call' "
            f"AND {SHARES_WITH} = ? ORDER BY seq",
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
        found = (approval_of(row[0], row[1]) for row in rows)
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
        return None if row is None else approval_of(row[0], row[1])

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

    def save_task(self, save: TaskSave) -> Event:
        """Writes the task, one event about it, and what the event decides (the answer to a
        key, approvals); in a transaction, so all of it is on disk, or none. A save that changes
        nothing but the task's step (every step) writes the step alone."""
        task, answer, layer = save.task, save.answer, save.layer
        if not save.new and task.step is not None and _step_alone(self._read.get(task.id), task):
            self._db.execute(
                "INSERT INTO task_steps (task, step) VALUES (?, ?) "
                "ON CONFLICT (task) DO UPDATE SET step = excluded.step",
                (task.id, task.step),
            )
        else:
            self._save_record(task, save.new)
        self._read[task.id] = dict(task.__dict__)
        event = append_event_row(self._db, task.id, save.kind, save.data)
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
        if save.drop_layer:
            self._db.execute("UPDATE layers SET active = 0 WHERE task = ?", (task.id,))
        for approval in save.approvals:
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


def _readable(task: Task) -> str:
    """The task's record, once it is known to read back: a value that would not (an infinity,
    which pydantic writes as null) is refused before it reaches the disk."""
    record = task.model_dump_json()
    try:
        Task.model_validate_json(record)
    except ValidationError as error:
        die(Problem.INVALID, f"task {task.id} cannot be recorded as it is: {error}")
    return record


def task_of_row(row: tuple[Any, ...]) -> Task | None:
    """The task of a row of TASK_COLUMNS."""
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


def approval_of(approval_id: Any, record: Any) -> Approval | None:
    try:
        return Approval.model_validate_json(record)
    except (ValidationError, ValueError, TypeError) as error:
        log.error(
            "the record of approval %r in box.db is damaged and left out: %s", approval_id, error
        )
        return None


def append_event_row(
    db: sqlite3.Connection, task_id: str, kind: str, data: dict[str, Any]
) -> Event:
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


def event_of_row(row: tuple[Any, ...]) -> Event:
    try:
        data = json.loads(row[4])
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (ValueError, TypeError) as error:
        log.error("event %s of task %s in box.db is damaged: %s", row[0], row[1], error)
        data = dict(DAMAGED_STEP)
    return Event(seq=row[0], task=row[1], kind=row[2], at=row[3], data=data)
