"""The record's version as it is on disk, read without SQLite and without writing a byte.

Before the manager opens the record for writing it must know the record is not newer than it
knows (schema.py). SQLite cannot say so untouched: even a read-only connection writes the WAL's
index (-shm), and makes -wal and -shm where they are missing. So the version is read as SQLite
would find it: the last committed copy of page 1 in the WAL if there is one, else page 1 of the
database; `user_version` is 4 bytes at offset 60 of it. The WAL is read as SQLite's recovery reads
it (https://sqlite.org/fileformat2.html#walformat): frames count while their salts are the
header's and their running checksums hold, and a reader sees up to the last commit frame among
them.
"""

import struct
from pathlib import Path

from boxd.manager.record.schema import NEWEST, RecordTooNew

_HEADER = b"SQLite format 3\x00"
_USER_VERSION = slice(60, 64)
_WAL_MAGIC = 0x377F0682
_WAL_HEADER = 32
_FRAME_HEADER = 24


def refuse_newer(database: Path, newest: int = NEWEST) -> None:
    """Raises RecordTooNew if the record is newer than `newest`, having changed nothing."""
    found = version_on_disk(database)
    if found > newest:
        raise RecordTooNew(str(database), found, newest)


def version_on_disk(database: Path) -> int:
    """The record's user_version; 0 for a database that is not there or holds nothing yet."""
    try:
        with open(database, "rb") as file:
            page_1 = file.read(100)
    except FileNotFoundError:
        return 0
    in_wal = _page_1_in_wal(Path(f"{database}-wal"))
    if in_wal is not None:
        page_1 = in_wal
    if len(page_1) < _USER_VERSION.stop or not page_1.startswith(_HEADER):
        # Empty, or not a database: SQLite says which when the manager opens it.
        return 0
    return int.from_bytes(page_1[_USER_VERSION], "big")


def _page_1_in_wal(wal: Path) -> bytes | None:
    """The last committed copy of page 1 in the WAL, if it holds one."""
    try:
        with open(wal, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return None
    if len(data) < _WAL_HEADER:
        return None
    magic, _, page_size, _, salt_1, salt_2, sum_1, sum_2 = struct.unpack(">8I", data[:32])
    if magic & ~1 != _WAL_MAGIC or page_size < 512 or page_size & (page_size - 1):
        return None
    order = ">" if magic & 1 else "<"
    sums = _checksum(order, data[:24], 0, 0)
    if sums != (sum_1, sum_2):
        return None
    found = pending = None
    at = _WAL_HEADER
    while at + _FRAME_HEADER + page_size <= len(data):
        page, commit, salts_1, salts_2, frame_1, frame_2 = struct.unpack(
            ">6I", data[at : at + _FRAME_HEADER]
        )
        body = data[at + _FRAME_HEADER : at + _FRAME_HEADER + page_size]
        if page == 0 or (salts_1, salts_2) != (salt_1, salt_2):
            break
        sums = _checksum(order, data[at : at + 8] + body, *sums)
        if sums != (frame_1, frame_2):
            break
        if page == 1:
            pending = body
        if commit:
            found = pending
        at += _FRAME_HEADER + page_size
    return found


def _checksum(order: str, data: bytes, sum_1: int, sum_2: int) -> tuple[int, int]:
    """SQLite's WAL checksum over `data`, carried on from (sum_1, sum_2)."""
    words = struct.unpack(f"{order}{len(data) // 4}I", data)
    for index in range(0, len(words), 2):
        sum_1 = (sum_1 + words[index] + sum_2) & 0xFFFFFFFF
        sum_2 = (sum_2 + words[index + 1] + sum_1) & 0xFFFFFFFF
    return sum_1, sum_2
