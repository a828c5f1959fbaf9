"""The record's schema and the steps that bring an older record forward.

The record's version is SQLite's `PRAGMA user_version`: 0 for a database made before the record
had one, then the number of steps below it has taken. Each step runs in one transaction with the
version it leads to, so a power cut in the middle of one leaves the record at the version before
it, whole, and the next start takes the step again. A fresh database takes every step in one
transaction: it is never seen at a version of before.

A step is never edited once released: a change to the record is a new step at the end. The
version marks more than the tables: a change to what the record holds that an older boxd would
misread (a new field in a task, an approval or the settings, whose models forbid fields they do
not know; a new value in a column; a new layout of BOX_HOME the manager keeps) takes a step too,
an empty one if no table changes, so an older boxd refuses that record rather than failing its
tasks as damaged or moving their files back (on_disk_version.py, docs/decisions.md).
"""

import logging
import sqlite3
from collections.abc import Callable, Sequence

from boxd.manager.record.ledger import EVENT_KEY, SHARES_WITH

log = logging.getLogger(__name__)

Step = Callable[[sqlite3.Connection], None]

# EVENT_KEY and SHARES_WITH are the expressions the ledger looks calls up by: an index serves a
# query only with the same expression, so a change to either takes a step that makes these two
# indexes again.
_TABLES_OF_VERSION_1 = f"""
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
CREATE INDEX IF NOT EXISTS tool_calls_by_key ON events (task, {EVENT_KEY}) WHERE kind = 'tool.call';
-- The calls that share a run, by the key of the call that runs: answered with it.
CREATE INDEX IF NOT EXISTS tool_calls_by_shared ON events (task, {SHARES_WITH})
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


def _statements(script: str) -> list[str]:
    """The script's statements, one by one: executescript would commit the step's transaction
    before it ran them."""
    found, pending = [], ""
    for line in script.splitlines(keepends=True):
        if not pending and line.lstrip().startswith("--"):
            continue
        pending += line
        if sqlite3.complete_statement(pending):
            found.append(pending.strip())
            pending = ""
    if pending.strip():
        raise ValueError(f"an unfinished statement in the record's schema: {pending.strip()}")
    return found


def _tables_of_version_1(db: sqlite3.Connection) -> None:
    """The tables as boxd made them before the record had a version: `IF NOT EXISTS`, because a
    database from then has some of them already (each boxd of then added the ones it lacked)."""
    for statement in _statements(_TABLES_OF_VERSION_1):
        db.execute(statement)


def _add_column(table: str, column: str, kind: str) -> Step:
    """A column a boxd from before the version added when it found it missing: a database from
    then may have it already."""

    def add(db: sqlite3.Connection) -> None:
        if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    return add


# In order: the record at version n has taken STEPS[:n]. Only ever appended to.
STEPS: tuple[Step, ...] = (
    # 1
    _tables_of_version_1,
    # 2: who a token is for.
    _add_column("tokens", "user", "TEXT"),
    # 3: an app's or a member's limits, as JSON; a row from before has none (the defaults).
    _add_column("tokens", "limits", "TEXT"),
)
NEWEST = len(STEPS)


# The manager's exit status when it refuses a newer record: EX_DATAERR of sysexits.h, "the input
# data was incorrect" (systemd shows it as 65/DATAERR). boxd.service names it in
# RestartPreventExitStatus=, so systemd leaves the manager stopped and failed, saying why, rather
# than starting it again every second to be refused again.
TOO_NEW_EXIT = 65


class RecordTooNew(Exception):
    """The record is at a version this boxd does not know: a newer boxd wrote it."""

    def __init__(self, path: str, found: int, newest: int) -> None:
        self.path, self.found, self.newest = path, found, newest
        super().__init__(
            f"boxd cannot open its record {path}: it is at version {found}, written by a newer "
            f"boxd, and this boxd ({_installed()}) knows versions up to {newest}. boxd left "
            "the record as it was and does not start. Install the newer boxd again: boxd never "
            "moves a record back to an older version."
        )


def _installed() -> str:
    # Only on this path: importlib.metadata is slow to import, and the manager has no other use.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"version {version('boxd')}"
    except PackageNotFoundError:
        return "of unknown version"


def migrate(db: sqlite3.Connection, path: str, steps: Sequence[Step] = STEPS) -> None:
    """Brings the record to the newest version, one step a transaction; refuses one newer
    (RecordTooNew) having written nothing. `db` is in autocommit (isolation_level=None)."""
    newest = len(steps)
    while True:
        # IMMEDIATE: the version read is the one the step is written over.
        db.execute("BEGIN IMMEDIATE")
        try:
            found = int(db.execute("PRAGMA user_version").fetchone()[0])
            if found > newest:
                raise RecordTooNew(path, found, newest)
            if found == newest:
                db.execute("COMMIT")
                return
            fresh = found == 0 and not _has_tables(db)
            taken = steps[found:] if fresh else steps[found : found + 1]
            for step in taken:
                step(db)
            now = found + len(taken)
            db.execute(f"PRAGMA user_version = {now:d}")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        if not fresh:
            log.info("the record %s moved from version %d to version %d", path, found, now)


def _has_tables(db: sqlite3.Connection) -> bool:
    return (
        db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' LIMIT 1").fetchone()
        is not None
    )
