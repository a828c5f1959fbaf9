"""The record's version and the steps that bring an older record forward, on real SQLite files."""

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from boxd.manager.record import schema
from boxd.manager.record.schema import NEWEST, STEPS, TOO_NEW_EXIT, RecordTooNew, migrate
from boxd.wire.models.approval_record import Approval
from boxd.wire.models.settings import Settings
from boxd.wire.models.task import Task
from boxd.wire.models.token_limits import TokenLimits

REPO = Path(__file__).resolve().parents[3]

# The tables of a boxd from before the record had a version, and before tokens had users and
# limits and boxd kept model requests or the agents' pause: what the first steps bring forward.
_BEFORE_VERSIONS = """
CREATE TABLE tasks (id TEXT PRIMARY KEY, created REAL NOT NULL, state TEXT NOT NULL,
    record TEXT NOT NULL);
CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, task TEXT NOT NULL,
    kind TEXT NOT NULL, at REAL NOT NULL, data TEXT NOT NULL);
CREATE TABLE tokens (hash TEXT PRIMARY KEY, name TEXT NOT NULL, role TEXT NOT NULL,
    created REAL NOT NULL);
INSERT INTO tasks VALUES ('t000000001', 1.0, 'done', '{"kept": true}');
INSERT INTO events (task, kind, at, data) VALUES ('t000000001', 'task.state', 1.0, '{}');
INSERT INTO tokens VALUES ('abc', 'phone', 'owner', 2.0);
"""


def _open(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    return db


def _version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def _shape(db: sqlite3.Connection) -> dict[str, object]:
    """Every table's and index's definition (however it was laid out in lines), and each
    table's columns as SQLite lists them."""
    shape: dict[str, object] = {}
    for kind, name, sql in db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name"):
        spaced = (sql or "").replace("(", " ( ").replace(")", " ) ").replace(",", " , ")
        shape[name] = " ".join(spaced.split())
        if kind == "table":
            shape[f"{name} columns"] = db.execute(f"PRAGMA table_info({name})").fetchall()
    return shape


def _later(db: sqlite3.Connection) -> None:
    """A step of a boxd newer than this one."""
    db.execute("CREATE TABLE later (x)")


def _fresh_shape(tmp_path: Path) -> dict[str, object]:
    db = _open(tmp_path / "fresh.db")
    migrate(db, "fresh.db")
    return _shape(db)


def test_a_fresh_record_is_made_at_the_newest_version(tmp_path: Path) -> None:
    db = _open(tmp_path / "box.db")
    migrate(db, "box.db")
    assert _version(db) == NEWEST
    assert {"tasks", "events", "tokens", "settings", "agents"} <= set(_shape(db))
    tokens = [row[1] for row in db.execute("PRAGMA table_info(tokens)")]
    assert tokens[-2:] == ["user", "limits"]
    # Opened again, nothing is left to do.
    migrate(db, "box.db")
    assert _version(db) == NEWEST


def test_a_fresh_record_is_made_whole_or_not_at_all(tmp_path: Path) -> None:
    def fails(db: sqlite3.Connection) -> None:
        raise RuntimeError("the last step failed")

    db = _open(tmp_path / "box.db")
    with pytest.raises(RuntimeError):
        migrate(db, "box.db", (*STEPS, fails))
    assert _version(db) == 0
    assert _shape(db) == {}


def test_a_record_from_before_versions_is_brought_forward(tmp_path: Path) -> None:
    db = _open(tmp_path / "box.db")
    db.executescript(_BEFORE_VERSIONS)
    migrate(db, "box.db")
    assert _version(db) == NEWEST
    assert _shape(db) == _fresh_shape(tmp_path)
    assert db.execute("SELECT id, record FROM tasks").fetchall() == [
        ("t000000001", '{"kept": true}')
    ]
    assert db.execute("SELECT count(*) FROM events").fetchone()[0] == 1
    assert db.execute("SELECT name, user, limits FROM tokens").fetchall() == [("phone", None, None)]


def test_a_record_of_the_last_boxd_before_versions_is_brought_forward(tmp_path: Path) -> None:
    """That boxd had made every table and column itself, with no version: each step finds what
    it would add already there."""
    db = _open(tmp_path / "box.db")
    migrate(db, "box.db")
    db.execute("PRAGMA user_version = 0")
    migrate(db, "box.db")
    assert _version(db) == NEWEST
    assert _shape(db) == _fresh_shape(tmp_path)


@pytest.mark.parametrize("version", range(1, NEWEST))
def test_each_version_is_brought_forward(tmp_path: Path, version: int) -> None:
    db = _open(tmp_path / "box.db")
    migrate(db, "box.db", STEPS[:version])
    assert _version(db) == version
    db.execute("INSERT INTO tasks VALUES ('t000000001', 1.0, 'done', '{}')")
    migrate(db, "box.db")
    assert _version(db) == NEWEST
    assert _shape(db) == _fresh_shape(tmp_path)
    assert db.execute("SELECT id FROM tasks").fetchall() == [("t000000001",)]


def test_each_step_is_taken_in_a_transaction_of_its_own(tmp_path: Path) -> None:
    """A record of before stops at the last step that was whole."""
    taken: list[int] = []

    def third_fails(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE half (x)")
        raise RuntimeError("this step failed")

    db = _open(tmp_path / "box.db")
    db.executescript(_BEFORE_VERSIONS)
    steps = (*STEPS, lambda db: taken.append(1), third_fails)
    with pytest.raises(RuntimeError):
        migrate(db, "box.db", steps)
    assert taken == [1]
    assert _version(db) == NEWEST + 1
    assert "half" not in _shape(db)


_CUT_MID_STEP = """
import os, sqlite3, sys
from boxd.manager.record.schema import STEPS, migrate

def cut(db):
    db.execute("CREATE TABLE later (x)")
    db.execute("INSERT INTO later VALUES (1)")
    os._exit(9)

db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA synchronous=FULL")
migrate(db, sys.argv[1], (*STEPS, cut))
"""


def test_a_process_killed_mid_step_leaves_the_version_of_before(tmp_path: Path) -> None:
    path = tmp_path / "box.db"
    db = _open(path)
    migrate(db, str(path))
    db.close()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    died = subprocess.run([sys.executable, "-c", _CUT_MID_STEP, str(path)], env=env, check=False)
    assert died.returncode == 9
    db = _open(path)
    assert _version(db) == NEWEST
    assert "later" not in _shape(db)
    # The next start takes the step again, whole.
    migrate(db, str(path), (*STEPS, _later))
    assert _version(db) == NEWEST + 1
    assert "later" in _shape(db)


def test_a_newer_record_is_refused_with_nothing_written(tmp_path: Path) -> None:
    db = _open(tmp_path / "box.db")
    migrate(db, "box.db", (*STEPS, _later))
    before = _shape(db)
    with pytest.raises(RecordTooNew) as refused:
        migrate(db, "/var/lib/box/box.db")
    assert _version(db) == NEWEST + 1
    assert _shape(db) == before
    words = str(refused.value)
    assert f"version {NEWEST + 1}" in words
    assert f"versions up to {NEWEST}" in words
    assert "/var/lib/box/box.db" in words
    assert "Install the newer boxd again" in words


def test_the_unit_lets_a_refused_manager_stay_stopped() -> None:
    unit = (REPO / "units" / "boxd.service").read_text().splitlines()
    assert f"RestartPreventExitStatus={TOO_NEW_EXIT}" in unit


def test_steps_are_only_ever_appended() -> None:
    """A released step never changes: these are the versions released so far, in order."""
    assert [step.__qualname__ for step in schema.STEPS[:3]] == [
        "_tables_of_version_1",
        "_add_column.<locals>.add",
        "_add_column.<locals>.add",
    ]


def _without_words(schema: Any) -> Any:
    """A model's JSON schema without its titles and descriptions, which no record holds."""
    if isinstance(schema, dict):
        return {
            key: _without_words(value)
            for key, value in schema.items()
            if key not in {"title", "description", "examples"}
        }
    if isinstance(schema, list):
        return [_without_words(value) for value in schema]
    return schema


# The shape of what the record holds at each version since it was pinned: its tables and the
# models it stores as JSON. Only the newest is checked; the others stay as the history.
_SHAPES = {3: "4a6b9c959bd9fb5de2e9729325993165b4e9f0d281c67303c654afebdcda4ea1"}


def test_the_record_s_shape_changes_only_with_its_version(tmp_path: Path) -> None:
    """A task, an approval, the settings or a token's limits that an older boxd would misread
    (their models forbid fields they do not know) must not reach the record at a version that
    boxd thinks it knows."""
    stored = (Task, Approval, Settings, TokenLimits)
    shape = {
        "tables": _fresh_shape(tmp_path),
        **{model.__name__: _without_words(model.model_json_schema()) for model in stored},
    }
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()
    assert _SHAPES.get(NEWEST) == digest, (
        f"What the record holds (a table, or a model it stores as JSON) changed since version "
        f"{NEWEST}. If an older boxd could misread a record written now, add a step at the end "
        "of boxd.manager.record.schema.STEPS (an empty one if no table changed), and pin this "
        f"shape as version {NEWEST + 1}: {digest}"
    )
