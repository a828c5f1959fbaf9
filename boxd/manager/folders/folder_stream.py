"""What boxd and a process running as a folder's owner send each other over a pipe.

A record is one line, `H <json>`. A file's content follows its record as data segments,
`D <offset> <length>` and that many bytes, then `E`. Holes are never sent: a sparse file is read
with SEEK_DATA/SEEK_HOLE and written back with holes, so a 2 TB file with 4 KB of data is 4 KB on
the wire and on disk. Either side may be hostile to the other (the owner can take over a process
that runs as them), so the reader bounds every line and segment and checks every offset.
"""

import errno
import json
import os
from typing import Any, Protocol

_LINE = 1 << 24  # a record holds a manifest of a whole folder at most
_CHUNK = 1 << 20


class StreamError(Exception):
    """The other side sent something that is not this protocol, or stopped half-way."""


class Sink(Protocol):
    def write(self, data: bytes, /) -> int: ...

    def flush(self) -> None: ...


class Source(Protocol):
    def readline(self, limit: int = -1, /) -> bytes: ...

    def read(self, size: int = -1, /) -> bytes: ...


class Writer:
    def __init__(self, out: Sink) -> None:
        self._out = out

    def record(self, data: dict[str, Any]) -> None:
        self._out.write(b"H " + json.dumps(data, separators=(",", ":")).encode() + b"\n")

    def content(self, fd: int, size: int) -> None:
        """Sends the data of an open regular file up to `size`, skipping its holes."""
        for start, end in data_ranges(fd, size):
            offset = start
            while offset < end:
                chunk = os.pread(fd, min(_CHUNK, end - offset), offset)
                if not chunk:
                    break  # the file shrank meanwhile: what is left reads as a hole
                self._out.write(f"D {offset} {len(chunk)}\n".encode())
                self._out.write(chunk)
                offset += len(chunk)
        self._out.write(b"E\n")

    def flush(self) -> None:
        self._out.flush()


class Reader:
    def __init__(self, source: Source) -> None:
        self._in = source

    def record(self) -> dict[str, Any] | None:
        """The next record, or None at the end of the stream."""
        line = self._in.readline(_LINE)
        if not line:
            return None
        if not line.startswith(b"H ") or not line.endswith(b"\n"):
            raise StreamError(f"expected a record, got {line[:80]!r}")
        data = json.loads(line[2:])
        if not isinstance(data, dict):
            raise StreamError("a record is not a JSON object")
        return data

    def content(self, fd: int, size: int) -> None:
        """Writes the segments that follow into `fd`, which ends up `size` bytes long."""
        os.ftruncate(fd, size)
        while True:
            line = self._in.readline(64)
            if line == b"E\n":
                return
            parts = line.split()
            if len(parts) != 3 or parts[0] != b"D":
                raise StreamError(f"expected file data, got {line[:80]!r}")
            offset, length = int(parts[1]), int(parts[2])
            if offset < 0 or length <= 0 or length > _CHUNK or offset + length > size:
                raise StreamError(f"file data out of bounds: {offset}+{length} of {size}")
            data = self._in.read(length)
            if len(data) != length:
                raise StreamError("the stream ended in the middle of a file")
            written = 0
            while written < length:
                written += os.pwrite(fd, data[written:], offset + written)


def data_ranges(fd: int, size: int) -> list[tuple[int, int]]:
    """The [start, end) ranges of an open file that hold data; all of it where the file system
    cannot tell holes."""
    ranges: list[tuple[int, int]] = []
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as error:
            if error.errno == errno.ENXIO:
                break  # only a hole from here on
            if error.errno == errno.EINVAL:
                return [*ranges, (offset, size)]
            raise
        if start >= size:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        ranges.append((start, end))
        offset = end
    return ranges
