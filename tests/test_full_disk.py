"""boxd.errors.is_full knows a full disk whichever layer says so."""

import errno
import sqlite3
from pathlib import Path

import pytest

from boxd.errors import is_full


def test_sqlites_full_database_is_a_full_disk(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "small.db")
    db.execute("CREATE TABLE t (x BLOB)")
    db.execute("PRAGMA max_page_count = 3")
    with pytest.raises(sqlite3.OperationalError) as full:
        for _ in range(10):
            db.execute("INSERT INTO t VALUES (?)", (b"x" * 4096,))
    assert full.value.sqlite_errorcode == sqlite3.SQLITE_FULL
    assert is_full(full.value)
    with pytest.raises(sqlite3.OperationalError) as other:
        db.execute("SELECT * FROM no_such_table")
    assert not is_full(other.value)
    db.close()


def test_enospc_and_edquot_are_a_full_disk() -> None:
    assert is_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not is_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_full(ValueError("full"))
