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

import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from boxd.manager.record.schema import NEWEST, RecordTooNew

_HEADER = b"SQLite format 3\x00"
_USER_VERSION = slice(60, 64)
_WAL_MAGIC = 0x377F0682
_WAL_HEADER = 32
_FRAME_HEADER = 24
# SQLite's largest page (SQLITE_MAX_PAGE_SIZE): its recovery ignores a WAL whose header says more,
# and a frame is read whole, so a header of larger pages is not read either.
_MAX_PAGE_SIZE = 65536


def refuse_newer(database: Path, newest: int = NEWEST) -> None:
    """Raises RecordTooNew if the record is newer than `newest`, having changed nothing.

    What a start after a crash pays is a look at each frame's header: the WAL's checksums, in
    Python about 0.2 ms a frame, are worked out only if some copy of page 1 says newer
    (bench/record_version.py)."""
    if not _newer_in_sight(database, newest):
        return
    found = version_on_disk(database)
    if found > newest:
        raise RecordTooNew(str(database), found, newest)


def version_on_disk(database: Path) -> int:
    """The record's user_version as SQLite would read it; 0 for a database that is not there or
    holds nothing yet."""
    with _opened(Path(f"{database}-wal")) as wal:
        in_wal = None if wal is None else _page_1_in_wal(wal)
    if in_wal is not None:
        return _version_of(in_wal)
    with _opened(database) as file:
        return 0 if file is None else _version_of(os.pread(file, 100, 0))


def _newer_in_sight(database: Path, newest: int) -> bool:
    """Whether page 1 in the database, or any copy of it in the WAL with the WAL's salts,
    committed or not, says a version above `newest`. If none does, the record is not newer,
    whichever copy SQLite would read. Frame by frame: a WAL may be larger than memory."""
    with _opened(database) as file:
        if file is not None and _version_of(os.pread(file, 100, 0)) > newest:
            return True
    with _opened(Path(f"{database}-wal")) as wal:
        header = None if wal is None else _wal_header(wal)
        if wal is None or header is None:
            return False
        page_size, salts = header[0], header[1]
        for at in _frames(wal, page_size):
            page, _, salt_1, salt_2 = struct.unpack(">4I", os.pread(wal, 16, at))
            # SQLite's recovery stops at the first frame of page 0, as at other salts: past it
            # (a file extended and never written is zeros, whose salts may be the header's), the
            # rest of a WAL as large as the disk would be read for nothing.
            if page == 0 or (salt_1, salt_2) != salts:
                return False
            if page == 1 and _version_of(os.pread(wal, 100, at + _FRAME_HEADER)) > newest:
                return True
    return False


@contextmanager
def _opened(path: Path) -> Iterator[int | None]:
    """The file, read only, or None if it is not there. Not through a link: the record is
    root's, in root's directory, and never one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _frames(wal: int, page_size: int) -> Iterator[int]:
    """Where each whole frame of the WAL begins."""
    size = os.fstat(wal).st_size
    at = _WAL_HEADER
    while at + _FRAME_HEADER + page_size <= size:
        yield at
        at += _FRAME_HEADER + page_size


def _version_of(page_1: bytes) -> int:
    if len(page_1) < _USER_VERSION.stop or not page_1.startswith(_HEADER):
        # Empty, or not a database: SQLite says which when the manager opens it.
        return 0
    return int.from_bytes(page_1[_USER_VERSION], "big")


def _wal_header(wal: int) -> tuple[int, tuple[int, int], str, tuple[int, int]] | None:
    """The WAL's page size, salts, byte order of its checksums and its header's checksum; None
    for a WAL whose header SQLite would not read."""
    data = os.pread(wal, _WAL_HEADER, 0)
    if len(data) < _WAL_HEADER:
        return None
    magic, _, page_size, _, salt_1, salt_2, sum_1, sum_2 = struct.unpack(">8I", data)
    if (
        magic & ~1 != _WAL_MAGIC
        or not 512 <= page_size <= _MAX_PAGE_SIZE
        or page_size & (page_size - 1)
    ):
        return None
    order = ">" if magic & 1 else "<"
    if _checksum(order, data[:24], 0, 0) != (sum_1, sum_2):
        return None
    return page_size, (salt_1, salt_2), order, (sum_1, sum_2)


def _page_1_in_wal(wal: int) -> bytes | None:
    """The last committed copy of page 1 in the WAL, if it holds one."""
    header = _wal_header(wal)
    if header is None:
        return None
    page_size, salts, order, sums = header
    found = pending = None
    for at in _frames(wal, page_size):
        frame = os.pread(wal, _FRAME_HEADER + page_size, at)
        page, commit, salt_1, salt_2, sum_1, sum_2 = struct.unpack_from(">6I", frame)
        if page == 0 or (salt_1, salt_2) != salts:
            break
        body = frame[_FRAME_HEADER:]
        sums = _checksum(order, frame[:8] + body, *sums)
        if sums != (sum_1, sum_2):
            break
        if page == 1:
            pending = body
        if commit:
            found = pending
    return found


def _checksum(order: str, data: bytes, sum_1: int, sum_2: int) -> tuple[int, int]:
    """SQLite's WAL checksum over `data`, carried on from (sum_1, sum_2)."""
    words = struct.unpack(f"{order}{len(data) // 4}I", data)
    for index in range(0, len(words), 2):
        sum_1 = (sum_1 + words[index] + sum_2) & 0xFFFFFFFF
        sum_2 = (sum_2 + words[index + 1] + sum_1) & 0xFFFFFFFF
    return sum_1, sum_2
