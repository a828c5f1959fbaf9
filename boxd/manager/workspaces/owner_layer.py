"""The layer of an owner's change: a folder made in a staging place inside the workspace's layer
store, then renamed to its layer's name once it is whole and recorded under that name
(owner_changes.py). A staged folder that no record names is a change cut off half-way, removed
as the manager opens (Layers.open); a recorded layer is complete, since it is renamed into place
whole before its record is written.

What it writes looks as a task would leave it, so later tasks can change it: group boxd-work,
group-writable (at_rest), files 0660 (0770 if the upload made them executable), folders 02770.
A deletion is overlayfs's whiteout (a 0/0 character device: tests use their own mark); a rename
is a copy of what the view shows at the old name, read from the stack with stack_view's care,
and a whiteout at the old name. Sync: the manager calls these in asyncio.to_thread.
"""

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from boxd.errors import Problem, die
from boxd.manager.folders.beneath import DIR_FLAGS, open_dir
from boxd.manager.record.disk import FULL_BELOW_BYTES, MIB
from boxd.manager.workspaces import stack_view
from boxd.manager.workspaces.diffs import kind_of, shown_name
from boxd.manager.workspaces.layers import STAGING
from boxd.manager.workspaces.stack_view import Stack

# One owner's change holds at most this many files and folders, and this many bytes of files:
# an upload beyond either is refused whole, and so is a folder rename that would copy more.
MAX_ENTRIES = 10_000
MAX_BYTES = 1024 * MIB
# Left free on the disk after an upload: the record, and the tasks, still need room.
KEEP_FREE = FULL_BELOW_BYTES
FILE_MODE = 0o660
EXEC_MODE = 0o770
FOLDER_MODE = 0o2770
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = MIB
# Folder fds a staged layer keeps open at most (Made.folder).
FOLDERS_HELD = 64
# Folders in folders a rename copies at most: deeper is refused in words (a task can make a
# chain of 2,000 within the 4,096-byte path; each level is a frame of _copy and a walk from the
# top of every level of the stack).
MAX_RENAME_DEPTH = 256


def whiteout(parent: int, name: str) -> None:
    """overlayfs's mark of a deleted path, a file or a whole folder: a 0/0 character device."""
    os.mknod(name, stat.S_IFCHR | 0o000, os.makedev(0, 0), dir_fd=parent)


Whiteout = Callable[[int, str], None]


def full_words(needed: int | None = None) -> str:
    more = f" (it needs {needed // MIB + 1} MiB more)" if needed else ""
    return (
        f"The box's disk is too full for this{more}: nothing was added, and the workspace is as "
        "it was. Free space on the box (undo tasks or remove workspaces you no longer need), "
        "then try again."
    )


def refuse_full(needed: int | None = None) -> NoReturn:
    die(Problem.FULL, full_words(needed))


def is_full(error: OSError) -> bool:
    return error.errno in (errno.ENOSPC, errno.EDQUOT)


@dataclass
class Made:
    """A staged layer: its folder's fd and path, and what was put in it."""

    path: Path
    fd: int
    gid: int
    files: int = 0
    folders: int = 0
    bytes: int = 0
    # The paths added (at most the first 20, for the title and the log).
    added: list[str] = field(default_factory=list)
    # Folders made in the layer, by path (each set up once), and the fds of the last used of
    # them: at most FOLDERS_HELD, so a tree of thousands of folders does not hold a descriptor
    # each in the manager, whose limit all its other work shares. The staging folder is root's
    # alone, so a folder let go is opened again by its path without a race.
    _made: set[str] = field(default_factory=set)
    _folders: "OrderedDict[str, int]" = field(default_factory=OrderedDict)

    def count(self, path: str, folder: bool, size: int = 0) -> None:
        if folder:
            self.folders += 1
        else:
            self.files += 1
        self.bytes += size
        if self.files + self.folders > MAX_ENTRIES:
            die(
                Problem.INVALID,
                f"one change holds at most {MAX_ENTRIES} files and folders: this one has more; "
                "nothing was added",
            )
        if self.bytes > MAX_BYTES:
            die(
                Problem.INVALID,
                f"one change holds at most {MAX_BYTES // MIB} MiB of files: this one has more; "
                "nothing was added",
            )
        if len(self.added) < 20:
            self.added.append(path)

    def folder(self, parts: list[str], stack: Stack) -> int:
        """The fd of the layer's folder at `parts` ([]: the layer itself), made with its
        parents where missing: as the stack has it (its owner, group and mode, as overlayfs
        copies a folder up), or as a new folder of the owner's."""
        fd = self.fd
        for number in range(len(parts)):
            path = "/".join(parts[: number + 1])
            inner = self._folders.get(path)
            if inner is not None:
                self._folders.move_to_end(path)
            else:
                name = parts[number]
                if path not in self._made:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, 0o700, dir_fd=fd)
                try:
                    inner = open_dir(fd, name)
                except OSError:
                    die(
                        Problem.INVALID,
                        f"{shown_name(path)[0]!r} is a file in the upload and a folder too; "
                        "nothing was added",
                    )
                self._folders[path] = inner
                self._let_go(keep=parts[: number + 1])
                if path in self._made:
                    fd = inner
                    continue
                self._made.add(path)
                below = stack_view.lookup(stack, path)
                if below is not None and stat.S_ISDIR(below.st_mode):
                    # As overlayfs copies a folder up: its mode and times kept, and it stays
                    # the tasks' to change.
                    self.own(inner, stat.S_IMODE(below.st_mode) | FOLDER_MODE)
                    os.utime(inner, ns=(below.st_atime_ns, below.st_mtime_ns))
                else:
                    self.own(inner, FOLDER_MODE)
            fd = inner
        return fd

    def _let_go(self, keep: list[str]) -> None:
        """Closes the least recently used folders' fds past FOLDERS_HELD, never one on the path
        being walked (`keep` and its parents), whose fds the walk still uses."""
        walking = {"/".join(keep[:number]) for number in range(1, len(keep) + 1)}
        for path in list(self._folders):
            if len(self._folders) <= FOLDERS_HELD:
                return
            if path not in walking:
                os.close(self._folders.pop(path))

    def own(self, fd: int, mode: int) -> None:
        if self.gid != -1:
            os.fchown(fd, -1, self.gid)
        os.fchmod(fd, mode)

    def close(self) -> None:
        for fd in self._folders.values():
            os.close(fd)
        self._folders.clear()
        if self.fd != -1:
            os.close(self.fd)
            self.fd = -1


def stage(store: Path, gid: int) -> Made:
    store.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = store / f"{STAGING}{secrets.token_hex(8)}"
    path.mkdir(mode=0o700)
    made = Made(path, os.open(path, DIR_FLAGS), gid)
    # The layer's own folder is the workspace's root in the merged view: as the base is.
    made.own(made.fd, FOLDER_MODE)
    return made


def throw_away(made: Made) -> None:
    made.close()
    shutil.rmtree(made.path, ignore_errors=True)


def synced(made: Made) -> None:
    """The layer's files on the disk before it is renamed into place: a recorded layer is whole
    after a power cut too."""
    for _, _, names, fd in os.fwalk(made.path, follow_symlinks=False):
        for name in names:
            try:
                file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                continue  # a whiteout or a link: nothing of its own to sync
            try:
                os.fsync(file)
            finally:
                os.close(file)
        os.fsync(fd)


def room_for(made: Made, size: int) -> None:
    """Refuses, in words, a file that would leave the disk with less than KEEP_FREE."""
    found = os.statvfs(made.fd)
    free = found.f_bavail * found.f_frsize
    if free - size < KEEP_FREE:
        refuse_full(size + KEEP_FREE - free)


def must_be_folder_or_absent(
    stack: Stack, parts: list[str], then: str = "nothing was changed"
) -> None:
    """Refuses a path whose own place, or a folder on its way, is something else than a folder
    in the workspace."""
    for number in range(1, len(parts) + 1):
        path = "/".join(parts[:number])
        found = stack_view.lookup(stack, path)
        if found is None:
            return
        if not stat.S_ISDIR(found.st_mode):
            kind = kind_of(found).value
            die(
                Problem.INVALID,
                f"{shown_name(path)[0]!r} is a {kind} in the workspace, not a folder: "
                f"delete or rename it first; {then}",
            )


def write_file(
    made: Made,
    stack: Stack,
    parts: list[str],
    read: Callable[[int], bytes],
    size: int,
    mode: int,
    mtime: float | None,
) -> None:
    """A new file at `parts` in the layer, its `size` bytes taken from `read`, never through a
    link (O_NOFOLLOW | O_EXCL in a folder the layer made)."""
    room_for(made, size)
    path = "/".join(parts)
    made.count(path, False, size)
    parent = made.folder(parts[:-1], stack)
    try:
        fd = os.open(parts[-1], _WRITE_FLAGS, 0o600, dir_fd=parent)
    except FileExistsError:
        die(Problem.INVALID, f"{shown_name(path)[0]!r} is in the upload twice; nothing was added")
    try:
        left = size
        while left > 0:
            chunk = read(min(left, _CHUNK))
            if not chunk:
                die(
                    Problem.INVALID,
                    f"the upload ended in the middle of {shown_name(path)[0]!r}; nothing was added",
                )
            _write_all(fd, chunk)
            left -= len(chunk)
        made.own(fd, mode)
        if mtime is not None:
            os.utime(fd, (mtime, mtime))
    except OSError as error:
        if is_full(error):
            refuse_full()
        raise
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def delete_layer(made: Made, stack: Stack, path: str, mark: Whiteout) -> str:
    """The layer that deletes `path` (a file, a link or a whole folder); the kind deleted."""
    parts = stack_view.checked(path)
    if not parts:
        die(Problem.INVALID, "the workspace itself cannot be deleted here: remove the workspace")
    found = stack_view.lookup(stack, path)
    if found is None:
        die(Problem.NOT_FOUND, f"there is nothing at {shown_name(path)[0]!r} in the workspace")
    mark(made.folder(parts[:-1], stack), parts[-1])
    return kind_of(found).value


def rename_layer(made: Made, stack: Stack, source: str, target: str, mark: Whiteout) -> str:
    """The layer that moves `source` to `target`: what the view shows at `source` copied to
    `target` (a folder with all it holds, within the caps), and a whiteout at `source`."""
    old, new = stack_view.checked(source), stack_view.checked(target)
    shown_old, shown_new = shown_name(source)[0], shown_name(target)[0]
    if not old or not new:
        die(Problem.INVALID, "the workspace itself cannot be renamed here")
    if new[: len(old)] == old:
        die(Problem.INVALID, f"{shown_old!r} cannot be moved into itself ({shown_new!r})")
    found = stack_view.lookup(stack, source)
    if found is None:
        die(Problem.NOT_FOUND, f"there is nothing at {shown_old!r} in the workspace")
    if stack_view.lookup(stack, target) is not None:
        die(
            Problem.INVALID,
            f"{shown_new!r} is already in the workspace: delete it first, or pick another name",
        )
    must_be_folder_or_absent(stack, new[:-1])
    _copy(made, stack, source, new, found)
    mark(made.folder(old[:-1], stack), old[-1])
    return kind_of(found).value


def _copy(
    made: Made, stack: Stack, source: str, new: list[str], found: os.stat_result, depth: int = 0
) -> None:
    """Copies what the view shows at `source` to `new` in the layer, as overlayfs copies up:
    mode and times kept, group boxd-work and group-writable. A link is copied as a link, its target
    never followed; a FIFO, socket or device is refused."""
    # No setuid or setgid bit: a task's setuid file is its own user's, but the copy is made by
    # root, and would be setuid root with the task's bytes.
    mode = stat.S_IMODE(found.st_mode) & ~(stat.S_ISUID | stat.S_ISGID)
    path = "/".join(new)
    shown = shown_name(source)[0]
    if stat.S_ISREG(found.st_mode):
        fd, _ = stack_view.open_file(stack, source)
        try:
            opened = os.fstat(fd)
            write_file(
                made, stack, new, lambda size: os.read(fd, size), opened.st_size, 0o600, None
            )
        finally:
            os.close(fd)
        _keep_attributes(made, stack, new, opened, mode | 0o060)
    elif stat.S_ISLNK(found.st_mode):
        made.count(path, False)
        os.symlink(
            stack_view.read_link(stack, source), new[-1], dir_fd=made.folder(new[:-1], stack)
        )
    elif stat.S_ISDIR(found.st_mode):
        if depth >= MAX_RENAME_DEPTH:
            die(
                Problem.INVALID,
                f"{shown[:200]!r} is more than {MAX_RENAME_DEPTH} folders deep: too deep to "
                "rename here; nothing was changed",
            )
        made.count(path, True)
        made.folder(new, stack)
        listing = stack_view.list_folder(stack, source)
        if listing.truncated:
            die(
                Problem.INVALID,
                f"{shown!r} holds more than {MAX_ENTRIES} entries: too many to rename at once",
            )
        for entry in listing.entries:
            if entry.not_utf8:
                die(Problem.INVALID, f"{shown!r} holds a name that is not UTF-8: not renamed")
            inner = f"{source}/{entry.name}"
            below = stack_view.lookup(stack, inner)
            if below is not None:
                _copy(made, stack, inner, [*new, entry.name], below, depth + 1)
        # Its fd again: copying what it holds may have let the first one go (FOLDERS_HELD).
        folder = made.folder(new, stack)
        made.own(folder, mode | FOLDER_MODE)
        os.utime(folder, ns=(found.st_atime_ns, found.st_mtime_ns))
    else:
        kind = kind_of(found).value
        die(Problem.INVALID, f"{shown!r} is {kind}: only files, links and folders are renamed")


def _keep_attributes(
    made: Made, stack: Stack, parts: list[str], was: os.stat_result, mode: int
) -> None:
    """A copied file keeps its mode (group-writable added) and times; its group is boxd-work,
    as every file boxd writes for the tasks."""
    parent = made.folder(parts[:-1], stack)
    fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        made.own(fd, mode)
        os.utime(fd, ns=(was.st_atime_ns, was.st_mtime_ns))
    finally:
        os.close(fd)
