"""What reading the record's version costs the manager at its start, before it opens the record.

Run from the repository: `python -m bench.record_version` (`--runs`). The manager reads it from
the files (boxd.manager.record.on_disk_version), never through SQLite, which would write: from
the database alone after a clean stop, and through the WAL after a crash left one. Printed for a
record of this boxd's version: what the start pays (`refuse_newer`: each frame's header), and
the exact reading with every checksum (`version_on_disk`: what a record that looks newer
costs). Beside them, the floor: SQLite's own reading of the same version, from a copy of the
same files (its recovery of the WAL, in C), which the manager pays next anyway as it opens it.
"""

import argparse
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from boxd.manager.record.on_disk_version import refuse_newer, version_on_disk
from boxd.manager.record.schema import NEWEST

# Frames of WAL: none (a clean stop), SQLite's automatic checkpoint (about 1,000), and a WAL that
# a long read held from being checkpointed.
WAL_FRAMES = (0, 1000, 4000)


def _record(directory: Path, frames: int) -> Path:
    """A record whose WAL holds about `frames` frames, left as a crash leaves it."""
    path = directory / "box.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("CREATE TABLE t (x)")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.execute("BEGIN")
    for _ in range(frames):
        # Each row of about a page's bytes takes a page of its own.
        db.execute("INSERT INTO t VALUES (?)", (os.urandom(3000),))
    db.execute(f"PRAGMA user_version = {NEWEST}")
    db.execute("COMMIT")
    if not frames:
        # A clean stop: SQLite folds the WAL into the database and removes it.
        db.close()
    # Copied as they stand: the connection still holds the WAL that a crash would leave.
    kept = directory / "kept"
    kept.mkdir()
    for end in ("", "-wal"):
        if Path(f"{path}{end}").exists():
            shutil.copy(f"{path}{end}", kept / f"box.db{end}")
    db.close()
    return kept / "box.db"


def _sqlite_reads(path: Path, scratch: Path) -> float:
    copy = scratch / "copy"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    for end in ("", "-wal"):
        if Path(f"{path}{end}").exists():
            shutil.copy(f"{path}{end}", copy / f"box.db{end}")
    began = time.perf_counter()
    db = sqlite3.connect(copy / "box.db")
    db.execute("PRAGMA user_version").fetchone()
    took = time.perf_counter() - began
    db.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory(prefix="bench-record-version-") as scratch:
        for frames in WAL_FRAMES:
            directory = Path(scratch) / str(frames)
            directory.mkdir()
            path = _record(directory, frames)
            wal = Path(f"{path}-wal")
            size = wal.stat().st_size if wal.exists() else 0
            found = size // (4096 + 24)
            start, exact, floor = [], [], []
            for _ in range(runs):
                began = time.perf_counter()
                refuse_newer(path)
                start.append(time.perf_counter() - began)
                began = time.perf_counter()
                assert version_on_disk(path) == NEWEST
                exact.append(time.perf_counter() - began)
                floor.append(_sqlite_reads(path, directory))
            least = statistics.median(floor)
            print(
                f"WAL of {found:5d} frames ({size / 2**20:5.1f} MiB): at the start "
                f"{statistics.median(start) * 1000:6.2f} ms, exact "
                f"{statistics.median(exact) * 1000:7.2f} ms; SQLite's own {least * 1000:6.2f} ms"
            )


if __name__ == "__main__":
    main()
