"""A folder of the workspace as it stands, written as a tar (pax format) to an fd as it is walked:
the download of a folder or of the whole workspace.

What is in it is what stack_view shows, by its own merge (stack_view.folder_entries), every
folder, file and link read from the layers' folder fds with the same care: links stored as links
and never followed, files opened with O_NOFOLLOW | O_NONBLOCK and archived only if fstat of the
open fd says plain file. Left out, and counted in the Summary: FIFOs, sockets and devices (a tar
of them is of no use to the owner and a device node in an archive is a trap for whoever extracts
it as root), a file swapped for a link, FIFO or folder between listing and opening, a folder that
changed under the walk, and paths longer than MAX_PATH bytes (no task's tool can open them).

Names go in exactly as their bytes: pax records carry any byte but NUL, so a name with a newline
or escape in it is that name in the archive, and one that is not UTF-8 goes in as is under
hdrcharset=BINARY (Python's tarfile writes the header; GNU tar, bsdtar and tarfile read it).

A file with holes is written in the PAX sparse format 1.0 (GNU.sparse.major=1, minor=0), its map
found with SEEK_DATA/SEEK_HOLE: a terabyte of hole costs a line of the map, not a terabyte of
zeros, so the archive is as big as the data on disk. A file that shrinks while it is read is
padded with zeros to the size its header gave, one that grows is cut there: the archive stays
well-formed and the entry says what the file was when it was opened, give or take the change.

Streamed: a 64 KiB buffer of headers, file data copied with sendfile; one folder's names at a time
are held (sorted, for an archive that is the same twice), never the archive. The walk is a loop
over a stack of folders, not recursion, so a 2,048-deep path costs no Python frames; each folder
is merged from the level roots (O(depth) opens), so the whole walk is linear in entries for any
tree within the path cap. The fd may be non-blocking (the manager's pipe is): a reader that takes
nothing for `stall` seconds ends the archive with Stalled, one that went away with EPIPE. Sync: the
manager runs it in a thread of its own.
"""

import contextlib
import errno
import os
import re
import select
import stat
import tarfile
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from boxd.errors import BoxError
from boxd.manager.folders.beneath import READ_FLAGS
from boxd.manager.workspaces.stack_view import (
    Stack,
    folder_levels,
    level_roots,
    merged_entries,
)
from boxd.wire.models.task_request import MAX_PATH

BLOCK = 512
RECORD = 20 * BLOCK  # tar's record: the end is padded to it, as GNU tar and tarfile pad
FLUSH_AT = 1 << 16
COPY_CHUNK = 1 << 20
# A reader (the web process, boxctl) that takes nothing for this long has gone away in all but
# name; the thread and its fds are not held for it.
STALL_SECONDS = 600.0
_ZEROS = bytes(COPY_CHUNK)


class Stalled(Exception):
    """The reader took nothing for the stall time: the archive was given up."""


@dataclass
class Summary:
    folders: int = 0
    files: int = 0
    sparse: int = 0
    links: int = 0
    changed: int = 0  # files that shrank while read (padded) or grew (cut)
    left_out: dict[str, int] = field(default_factory=dict)  # why -> how many

    def leave_out(self, why: str) -> None:
        self.left_out[why] = self.left_out.get(why, 0) + 1


def archive_name(workspace: str, path: str) -> str:
    """The download's file name: "<workspace>.tar", or "<workspace>-<last name>.tar" for a
    folder, the last name kept to letters, digits, '.', '_' and '-' so no header or shell can be
    fooled by it. Its stem is also the one folder the archive's entries are under."""
    if path == "":
        return f"{_safe(workspace)}.tar"
    last = _safe(path.rsplit("/", 1)[-1])
    return f"{_safe(workspace)}-{last}.tar"


def _safe(name: str) -> str:
    kept = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100].lstrip(".")
    return kept or "_"


class _Out:
    """The archive's fd: headers buffered, data copied in, a non-blocking fd waited on."""

    def __init__(self, fd: int, stall: float) -> None:
        self.fd = fd
        self.stall = stall
        self.buffer = bytearray()
        self.written = 0  # bytes of archive so far, the buffer's too
        self.sendfile = True

    def put(self, data: bytes | bytearray | memoryview) -> None:
        self.buffer += data
        self.written += len(data)
        if len(self.buffer) >= FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        view = memoryview(self.buffer)
        while view:
            try:
                done = os.write(self.fd, view)
            except BlockingIOError:
                self._wait()
                continue
            view = view[done:]
        view.release()
        self.buffer.clear()

    def zeros(self, count: int) -> None:
        while count > 0:
            step = min(count, COPY_CHUNK)
            self.put(_ZEROS[:step])
            count -= step

    def pad(self) -> None:
        self.put(_ZEROS[: -self.written % BLOCK])

    def copy(self, source: int, offset: int, count: int) -> int:
        """Copies up to `count` bytes of `source` from `offset`; fewer if it ends first."""
        self.flush()
        copied = 0
        while copied < count:
            step = min(count - copied, COPY_CHUNK)
            try:
                done = self._copy_some(source, offset + copied, step)
            except BlockingIOError:
                self._wait()
                continue
            if done == 0:
                break  # the file ended early: it shrank since it was opened
            copied += done
            self.written += done
        return copied

    def _copy_some(self, source: int, offset: int, count: int) -> int:
        if self.sendfile:
            try:
                return os.sendfile(self.fd, source, offset, count)
            except OSError as error:
                if error.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                self.sendfile = False  # an fd sendfile cannot write to: read and write
        data = os.pread(source, count, offset)
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view) :]
            except BlockingIOError:
                self._wait()
        return len(data)

    def _wait(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLOUT)
        if not poller.poll(self.stall * 1000):
            raise Stalled(f"the reader took nothing for {self.stall:.0f} s")


class Prepared:
    """The archive's start, made before its answer is sent: the levels' roots held open, and the
    folder found (or refused in words) with its levels' fds. write_prepared closes them all;
    close() does if it is never written."""

    def __init__(self, stack: Stack, path: str) -> None:
        self.stack = stack
        self.path = path
        self.closing = contextlib.ExitStack()
        try:
            self.roots = self.closing.enter_context(level_roots(stack))
            self.levels = folder_levels(stack, self.roots, path)
        except BaseException:
            self.closing.close()
            raise
        self.closing.callback(_close, self.levels)

    def close(self) -> None:
        self.closing.close()


def write_archive(
    stack: Stack, path: str, top: str, fd: int, *, stall: float = STALL_SECONDS
) -> Summary:
    """Writes the folder `path` of the workspace ("" is all of it) to `fd` as a tar whose entries
    are under the one folder `top`. Raises BoxError before writing anything if `path` is not a
    folder; OSError (EPIPE) or Stalled if the reader goes away."""
    return write_prepared(Prepared(stack, path), top, fd, stall=stall)


def write_prepared(
    prepared: Prepared, top: str, fd: int, *, stall: float = STALL_SECONDS
) -> Summary:
    summary = Summary()
    out = _Out(fd, stall)
    stack = prepared.stack
    with prepared.closing:
        walk = _Walk(stack, out, summary)
        try:
            first = merged_entries(stack, prepared.levels)
            walk.header(_info(top, tarfile.DIRTYPE, 0o755, int(time.time())))
            summary.folders += 1
            walk.run(_Frame(prepared.path, top, iter(first), prepared.levels, owns=False))
        finally:
            walk.close()
    out.put(bytes(2 * BLOCK))
    out.put(_ZEROS[: -out.written % RECORD])
    out.flush()
    return summary


def _info(name: str, kind: bytes, mode: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = mtime
    return info


_Levels = list[tuple[str | None, int]]


@dataclass
class _Frame:
    """A folder on the walk's way down: its path in the workspace and name in the archive, the
    entries still to write, and its levels' fds if it holds them (one frame in HOLD_EVERY)."""

    path: str
    archived: str
    entries: Iterator[tuple[str, os.stat_result, str | None]]
    held: _Levels | None
    owns: bool = True  # closes what it holds when done; the first frame's are the Prepared's


# A folder's levels are held open by one frame in this many down the path: a 2,048-deep path
# holds 128 sets of fds (the manager's limit is 1,024 fds), and a folder whose levels are not
# held opens them from the held folder above in at most this many steps: linear work, no walk
# from the top for each folder of a deep path.
HOLD_EVERY = 16


class _Walk:
    def __init__(self, stack: Stack, out: _Out, summary: Summary) -> None:
        self.stack = stack
        self.out = out
        self.summary = summary
        self.frames: list[_Frame] = []
        # The levels of the deepest frame when it holds none: opened once per visit.
        self.current: tuple[_Frame, _Levels] | None = None

    def header(self, info: tarfile.TarInfo) -> None:
        fast = _ustar(info)
        self.out.put(fast or info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))

    def run(self, first: _Frame) -> None:
        self.frames.append(first)
        while self.frames:
            frame = self.frames[-1]
            entry = next(frame.entries, None)
            if entry is None:
                self._pop()
                continue
            name, info, layer = entry
            inside = _join(frame.path, name)
            archived = f"{frame.archived}/{name}"
            if len(os.fsencode(inside)) > MAX_PATH:
                self.summary.leave_out("path longer than 4096 bytes")
                continue
            if stat.S_ISDIR(info.st_mode):
                self._folder(frame, name, info, inside, archived)
            elif stat.S_ISLNK(info.st_mode):
                self._link(name, layer, archived, int(info.st_mtime))
            elif stat.S_ISREG(info.st_mode):
                self._file(name, layer, archived)
            else:
                self.summary.leave_out("FIFO, socket or device")

    def _folder(
        self, frame: _Frame, name: str, info: os.stat_result, inside: str, archived: str
    ) -> None:
        try:
            levels = folder_levels(self.stack, self._levels(), name)
        except (BoxError, OSError):
            self.summary.leave_out("changed while archived")
            return
        try:
            entries = merged_entries(self.stack, levels)
        except OSError:
            _close(levels)
            self.summary.leave_out("changed while archived")
            return
        # Its owner can always enter and list what they downloaded.
        mode = (stat.S_IMODE(info.st_mode) & 0o777) | 0o700
        self.header(_info(archived, tarfile.DIRTYPE, mode, int(info.st_mtime)))
        self.summary.folders += 1
        held = levels if len(self.frames) % HOLD_EVERY == 0 else None
        self._forget()
        self.frames.append(_Frame(inside, archived, iter(entries), held))
        if held is None:
            self.current = self.frames[-1], levels

    def _pop(self) -> None:
        frame = self.frames.pop()
        self._forget()
        if frame.held is not None and frame.owns:
            _close(frame.held)

    def _levels(self) -> _Levels:
        """The levels of the deepest frame's folder, opened from the nearest frame above that
        holds its own if it does not."""
        frame = self.frames[-1]
        if frame.held is not None:
            return frame.held
        if self.current is not None and self.current[0] is frame:
            return self.current[1]
        self._forget()
        anchor = next(above for above in reversed(self.frames) if above.held is not None)
        relative = frame.path[len(anchor.path) :].lstrip("/")
        assert anchor.held is not None
        self.current = frame, folder_levels(self.stack, anchor.held, relative)
        return self.current[1]

    def _forget(self) -> None:
        if self.current is not None:
            _close(self.current[1])
            self.current = None

    def close(self) -> None:
        self._forget()
        while self.frames:
            self._pop()

    def _parent(self, layer: str | None) -> int:
        """The fd of the deepest frame's folder in `layer` (a layer that shows an entry of a
        folder shows the folder); KeyError or BoxError if the folder changed since its listing."""
        return dict(self._levels())[layer]

    def _link(self, name: str, layer: str | None, archived: str, mtime: int) -> None:
        try:
            target = os.readlink(os.fsencode(name), dir_fd=self._parent(layer))
        except (OSError, KeyError, BoxError):
            self.summary.leave_out("changed while archived")
            return
        info = _info(archived, tarfile.SYMTYPE, 0o777, mtime)
        info.linkname = os.fsdecode(target)
        self.header(info)
        self.summary.links += 1

    def _file(self, name: str, layer: str | None, archived: str) -> None:
        try:
            fd = os.open(name, READ_FLAGS, dir_fd=self._parent(layer))
        except (OSError, KeyError, BoxError):
            # ELOOP: swapped for a link; ENXIO: for a socket; ENOENT: gone; the folder swapped
            # since it was listed: its level is not found again. Left out, never followed.
            self.summary.leave_out("changed while archived")
            return
        try:
            opened_info = os.fstat(fd)
            if not stat.S_ISREG(opened_info.st_mode):
                self.summary.leave_out("changed while archived")
                return
            os.set_blocking(fd, True)
            self._data(fd, opened_info, archived)
        finally:
            os.close(fd)

    def _data(self, fd: int, info: os.stat_result, archived: str) -> None:
        size = info.st_size
        mode, mtime = (stat.S_IMODE(info.st_mode) & 0o777) | 0o600, int(info.st_mtime)
        # Holes only where fewer blocks than bytes are on disk: a dense file needs no lseek.
        dense = info.st_blocks * 512 >= size
        extents = array("q", (0, size)) if dense else data_extents(fd, size)
        if size == 0 or list(extents) == [0, size]:
            entry = _info(archived, tarfile.REGTYPE, mode, mtime)
            entry.size = size
            self.header(entry)
            self._copy(fd, [0, size])
            self.summary.files += 1
            return
        # PAX sparse 1.0: the map (count, then offset and size of each data part, a number a
        # line) in the entry's first blocks, then the data parts back to back. A file ending
        # in a hole ends its map with (size, 0), as GNU tar writes it, so extractors truncate.
        if not extents or extents[-2] + extents[-1] < size:
            extents.extend((size, 0))
        numbers = [str(len(extents) // 2), *map(str, extents)]
        sparse_map = ("\n".join(numbers) + "\n").encode()
        sparse_map += bytes(-len(sparse_map) % BLOCK)
        head, _, last = archived.rpartition("/")
        entry = _info(f"{head}/GNUSparseFile.0/{last}", tarfile.REGTYPE, mode, mtime)
        entry.size = len(sparse_map) + sum(extents[1::2])
        entry.pax_headers = {
            "GNU.sparse.major": "1",
            "GNU.sparse.minor": "0",
            "GNU.sparse.name": archived,
            "GNU.sparse.realsize": str(size),
        }
        self.header(entry)
        self.out.put(sparse_map)
        self._copy(fd, extents)
        self.summary.files += 1
        self.summary.sparse += 1

    def _copy(self, fd: int, extents: "array[int] | list[int]") -> None:
        changed = False
        for number in range(0, len(extents), 2):
            offset, count = extents[number], extents[number + 1]
            copied = 0 if changed else self.out.copy(fd, offset, count)
            if copied < count:
                changed = True  # shrank: the rest is zeros, the size the header promised
                self.out.zeros(count - copied)
        self.out.pad()
        self.summary.changed += changed


def data_extents(fd: int, size: int) -> "array[int]":
    """Offset and length of each part of the file's first `size` bytes that holds data, flat;
    a filesystem without holes answers one part, the whole file."""
    extents = array("q")
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as error:
            if error.errno == errno.ENXIO:
                break  # only a hole from here on
            raise
        if start >= size:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        extents.extend((start, end - start))
        offset = end
    return extents


# The limit of a ustar size or time field: 11 octal digits.
_OCTAL_11 = 8**11


def _ustar(info: tarfile.TarInfo) -> bytes | None:
    """The header tarfile writes for an entry that needs no pax record (an ASCII name and link
    of at most 100 bytes, a size and time that fit), made at a fifth of tarfile's cost: a
    workspace of small files is mostly headers. None: tarfile writes it."""
    name = info.name + "/" if info.type == tarfile.DIRTYPE else info.name
    link = info.linkname
    if not (
        len(name) <= 100
        and len(link) <= 100
        and name.isascii()
        and link.isascii()
        and not info.pax_headers
        and 0 <= info.size < _OCTAL_11
        and 0 <= info.mtime < _OCTAL_11
    ):
        return None
    head = b"".join(
        (
            name.encode().ljust(100, b"\0"),
            b"%07o\0%07o\0%07o\0" % (info.mode & 0o7777, 0, 0),
            b"%011o\0%011o\0" % (info.size, int(info.mtime)),
            b"        ",  # the checksum, as spaces while it is summed
            info.type,
            link.encode().ljust(100, b"\0"),
            tarfile.POSIX_MAGIC,
            bytes(80),  # no owner's or group's name, no device numbers
        )
    ).ljust(BLOCK, b"\0")
    return head[:148] + b"%06o\0" % sum(head) + head[155:]


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def _close(levels: _Levels) -> None:
    for _, fd in levels:
        os.close(fd)
