"""The record's version read from its files, as SQLite would find it, without writing a byte."""

import hashlib
import os
import shutil
import sqlite3
import struct
from pathlib import Path

import pytest

from boxd.manager.record.on_disk_version import _checksum, refuse_newer, version_on_disk
from boxd.manager.record.schema import NEWEST, RecordTooNew
from boxd.manager.record.store import Store


def _files(directory: Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
    }


def _writer(path: Path) -> sqlite3.Connection:
    """A connection that leaves what it commits in the WAL, as a boxd that lost power does."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("CREATE TABLE IF NOT EXISTS t (x)")
    return db


def _sqlite_reads(directory: Path, tmp_path: Path) -> int:
    """What SQLite itself reads, from a copy of the database and its WAL."""
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("box.db", "box.db-wal"):
        if (directory / name).exists():
            shutil.copy(directory / name, copy / name)
    db = sqlite3.connect(copy / "box.db")
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def test_no_record_and_an_empty_one_are_version_0(tmp_path: Path) -> None:
    assert version_on_disk(tmp_path / "box.db") == 0
    (tmp_path / "box.db").touch()
    assert version_on_disk(tmp_path / "box.db") == 0


@pytest.mark.parametrize("version", [1, 255, 70000, 2**31 - 1])
def test_the_version_in_the_database(tmp_path: Path, version: int) -> None:
    db = sqlite3.connect(tmp_path / "box.db")
    db.execute(f"PRAGMA user_version = {version}")
    db.close()
    assert version_on_disk(tmp_path / "box.db") == version


def test_the_version_in_the_wal_not_yet_in_the_database(tmp_path: Path) -> None:
    path = tmp_path / "box.db"
    db = _writer(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.execute("PRAGMA user_version = 3")
    db.execute("INSERT INTO t VALUES (1)")
    db.execute("PRAGMA user_version = 4")
    db.execute("INSERT INTO t VALUES (2)")
    assert (tmp_path / "box.db-wal").stat().st_size > 0
    with open(path, "rb") as file:
        assert int.from_bytes(file.read(64)[60:64], "big") == 0
    assert version_on_disk(path) == 4 == _sqlite_reads(tmp_path, tmp_path)
    db.close()


def test_a_torn_last_frame_is_not_read(tmp_path: Path) -> None:
    """A commit whose frame was half written when the power went is not the record's: the
    version is the one committed before it, as SQLite reads it."""
    path = tmp_path / "box.db"
    db = _writer(path)
    db.execute("PRAGMA user_version = 5")
    db.execute("PRAGMA user_version = 6")
    wal = tmp_path / "box.db-wal"
    data = bytearray(wal.read_bytes())
    data[-100] ^= 0xFF
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "box.db").write_bytes(path.read_bytes())
    (saved / "box.db-wal").write_bytes(bytes(data))
    assert version_on_disk(saved / "box.db") == 5 == _sqlite_reads(saved, tmp_path)
    db.close()


def test_a_wal_of_another_generation_is_not_read(tmp_path: Path) -> None:
    """After a checkpoint SQLite writes the WAL again from its start with new salts: what is
    left of the old frames past the new ones is not the record's."""
    path = tmp_path / "box.db"
    db = _writer(path)
    for version in range(1, 30):
        db.execute(f"PRAGMA user_version = {version}")
    db.execute("PRAGMA wal_checkpoint(PASSIVE)")
    db.execute("INSERT INTO t VALUES (1)")
    db.execute("PRAGMA user_version = 2")
    # The old frames are still there, past the two new ones.
    assert (tmp_path / "box.db-wal").stat().st_size > 20 * 4096
    assert version_on_disk(path) == 2 == _sqlite_reads(tmp_path, tmp_path)
    db.close()


def test_a_newer_record_is_refused_without_a_byte_changed(tmp_path: Path) -> None:
    """Even with a WAL and its index left behind, as after a crash: a read-only SQLite
    connection would have written the index."""
    path = tmp_path / "box.db"
    db = _writer(path)
    db.execute(f"PRAGMA user_version = {NEWEST + 1}")
    before = _files(tmp_path)
    assert set(before) == {"box.db", "box.db-wal", "box.db-shm"}
    with pytest.raises(RecordTooNew) as refused:
        refuse_newer(path)
    assert refused.value.found == NEWEST + 1
    assert _files(tmp_path) == before
    db.close()


def test_a_torn_commit_that_would_make_the_record_newer_is_not_refused(tmp_path: Path) -> None:
    """Page 1 of a commit cut short says a version above this boxd's, but SQLite would not read
    it: the record is this boxd's still."""
    path = tmp_path / "box.db"
    db = _writer(path)
    db.execute(f"PRAGMA user_version = {NEWEST}")
    db.execute(f"PRAGMA user_version = {NEWEST + 1}")
    data = bytearray((tmp_path / "box.db-wal").read_bytes())
    data[-100] ^= 0xFF
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "box.db").write_bytes(path.read_bytes())
    (saved / "box.db-wal").write_bytes(bytes(data))
    refuse_newer(saved / "box.db")
    assert version_on_disk(saved / "box.db") == NEWEST == _sqlite_reads(saved, tmp_path)
    # Whole, the same commit is refused.
    with pytest.raises(RecordTooNew):
        refuse_newer(path)
    db.close()


async def test_the_store_refuses_a_newer_record_before_it_opens_it(tmp_path: Path) -> None:
    path = tmp_path / "box.db"
    store = Store(path)
    await store.open()
    await store.close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {NEWEST + 7}")
    db.close()
    path.chmod(0o644)
    before = _files(tmp_path)
    refused = Store(path)
    with pytest.raises(RecordTooNew, match=f"version {NEWEST + 7}"):
        await refused.open()
    await refused.close()
    assert _files(tmp_path) == before
    # Not even its mode: the store makes it root's alone once it opens it.
    assert path.stat().st_mode & 0o777 == 0o644


def _wal_of_one_commit(
    page_size: int, page_1: bytes, salts: tuple[int, int] = (0x11111111, 0x22222222)
) -> bytes:
    """A WAL whose header and one frame, a commit of page 1, have SQLite's salts and
    checksums (big-endian), with the page size the header says."""
    head = struct.pack(">6I", 0x377F0683, 3007000, page_size, 0, *salts)
    sums = _checksum(">", head, 0, 0)
    head += struct.pack(">2I", *sums)
    body = page_1.ljust(page_size, b"\0")
    frame_start = struct.pack(">4I", 1, 1, *salts)
    sums = _checksum(">", frame_start[:8] + body, *sums)
    return head + frame_start + struct.pack(">2I", *sums) + body


def test_a_wal_of_a_page_size_sqlite_never_writes_is_not_read(tmp_path: Path) -> None:
    """SQLite's pages are 64 KiB at most, and its recovery ignores a WAL whose header says
    more. Read as it said, a header of 1 GiB pages would have had each frame read whole into
    memory, and the checksums worked out over it."""
    path = tmp_path / "box.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 2")
    db.close()
    page_1 = bytearray(path.read_bytes()[:4096])
    page_1[60:64] = (NEWEST + 5).to_bytes(4, "big")
    (tmp_path / "box.db-wal").write_bytes(_wal_of_one_commit(2**17, bytes(page_1)))
    assert version_on_disk(path) == 2 == _sqlite_reads(tmp_path, tmp_path)
    refuse_newer(path)


@pytest.mark.parametrize("salts", [(0x11111111, 0x22222222), (0, 0)])
@pytest.mark.parametrize("newer", [True, False])
def test_a_huge_wal_is_read_up_to_its_first_frame_sqlite_would_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, salts: tuple[int, int], newer: bool
) -> None:
    """A WAL of 8 GiB (sparse: its frames past the first are zeros, as a file extended but not
    written is) is read up to the first frame that is not one: a frame of page 0 never is, and
    salts of zeros, which SQLite may draw, match the header's. Counted, not timed."""
    path = tmp_path / "box.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 2")
    db.close()
    version = NEWEST + 5 if newer else 3
    page_1 = bytearray(path.read_bytes()[:4096])
    page_1[60:64] = version.to_bytes(4, "big")
    wal = tmp_path / "box.db-wal"
    wal.write_bytes(_wal_of_one_commit(4096, bytes(page_1), salts))
    os.truncate(wal, 8 * 2**30)
    reads: list[int] = []
    pread = os.pread

    def counted(fd: int, length: int, offset: int) -> bytes:
        reads.append(length)
        return pread(fd, length, offset)

    monkeypatch.setattr(os, "pread", counted)
    assert version_on_disk(path) == version
    if newer:
        with pytest.raises(RecordTooNew):
            refuse_newer(path)
    else:
        refuse_newer(path)
    # The database's first bytes, the WAL's header, and its first two frames, each a few times.
    assert len(reads) <= 12 and sum(reads) <= 6 * (24 + 4096) + 400
