"""The copy of the owner's real folders that personal tasks work on.

A personal workspace's base is a mirror of the real folders, brought up to date before each task
starts: only what changed since is copied, by size and modification time. The mirror belongs to
group boxd-work and is group-writable, so a task's own user can change its overlay copy, while
the real folders keep their owner and modes. Files keep their modification times, so what a task
saw can be compared with the real folder when the owner keeps it.

boxd never reads the real folders itself: a process running as the account that asked for the
task (as_owner.py; the folder's owner when root asked) reads them and streams what it read, and
boxd writes it into the mirror by directory fds, following no link (beneath.py). Sparse files
stay sparse. Before each task the mirror is read again as that task's account: what the account
cannot read is not in it, and what it could read and no longer can is taken out.
"""

import os
import stat
from pathlib import Path
from typing import Any

from boxd.manager.folders.beneath import DIR_FLAGS, lstat_at, open_dir, parent_of, remove_at, walk
from boxd.manager.folders.folder_stream import Reader, StreamError
from boxd.manager.folders.folders import Folder
from boxd.manager.folders.owner_process import OwnerError, OwnerProcess
from boxd.manager.units.users import user_name

# A path's state as far as the copy goes: kind, size and modification time (0 for folders, whose
# times change with their entries). Equal states are the same file; keep.py compares them too.
State = tuple[str, int, int]


class MirrorError(Exception):
    """The real folder could not be read into the mirror; the words say why."""


def state_of(info: os.stat_result) -> State:
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        return ("dir", 0, 0)
    kind = "link" if stat.S_ISLNK(mode) else "file" if stat.S_ISREG(mode) else "other"
    return (kind, info.st_size, info.st_mtime_ns)


def folder_owner(folder: Path) -> int:
    """The owner of a real folder, never root."""
    try:
        info = folder.lstat()
    except OSError:
        info = None
    if info is None or not stat.S_ISDIR(info.st_mode):
        raise MirrorError(f"folder {folder} is gone or has become a link")
    if info.st_uid == 0:
        raise MirrorError(f"folder {folder} belongs to root now; agents may not use root's folders")
    return info.st_uid


def acting_uid(asker: int, folder: Path) -> int:
    """The uid that reads and writes a real folder for the account that asked: that account,
    which must still own it; for root, the folder's owner, so that root's power is never used on
    a folder a user controls. The process as that uid checks the owner again on the folder's fd
    (as_owner.py)."""
    owner = folder_owner(folder)
    if asker not in (0, owner):
        raise MirrorError(
            f"folder {folder} belongs to {user_name(owner)} now, not to {user_name(asker)}, "
            "who asked for the task"
        )
    return owner


def _file_mode(mode: int) -> int:
    return (mode | 0o060) & 0o1777


def _take(root: int, record: dict[str, Any], reader: Reader, gid: int) -> int:
    """Puts one entry the owner's process sent into the mirror; 1 if it changed."""
    parent, name = parent_of(root, str(record["p"]))
    try:
        present = lstat_at(parent, name)
        kind = record["k"]
        if kind == "dir":
            if present is not None and not stat.S_ISDIR(present.st_mode):
                remove_at(parent, name)
                present = None
            if present is None:
                os.mkdir(name, 0o700, dir_fd=parent)
            made = open_dir(parent, name)
            try:
                os.fchown(made, -1, gid)
                os.fchmod(made, (int(record["m"]) | 0o2070) & 0o3777)
            finally:
                os.close(made)
            return int(present is None)
        if kind == "link":
            times = (int(record["a"]), int(record["t"]))
            if present is not None and state_of(present) == ("link", record["s"], times[1]):
                return 0
            remove_at(parent, name)
            os.symlink(str(record["l"]), name, dir_fd=parent)
            os.chown(name, -1, gid, dir_fd=parent, follow_symlinks=False)
            os.utime(name, ns=times, dir_fd=parent, follow_symlinks=False)
            return 1
        if kind != "file":
            raise StreamError(f"unknown kind {kind!r}")
        if record.get("same") and present is not None and stat.S_ISREG(present.st_mode):
            return 0
        remove_at(parent, name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=parent)
        try:
            reader.content(fd, int(record["s"]))
            os.fchown(fd, -1, gid)
            os.fchmod(fd, _file_mode(int(record["m"])))
            os.utime(fd, ns=(int(record["a"]), int(record["t"])))
        finally:
            os.close(fd)
        return 1
    finally:
        os.close(parent)


def sync_tree(source: Path, target: Path, gid: int, asker: int) -> int:
    """Makes `target` a copy of the real folder `source`, read as the account `asker` (as its
    owner, when root asked); returns how many entries were copied or removed."""
    uid = acting_uid(asker, source)
    root = os.open(target, DIR_FLAGS)
    try:
        have = {path: list(state_of(info)) for path, info in walk(root)}
        seen: set[str] = set()
        changed = 0
        try:
            reading = OwnerProcess(uid, "read", str(source))
        except (OwnerError, OSError) as error:
            raise MirrorError(f"folder {source} could not be read as its owner: {error}") from None
        with reading as child:
            child.writer.record({"have": have})
            child.close_input()
            try:
                while (record := child.reader.record()) is not None:
                    if "error" in record:
                        raise MirrorError(f"folder {source}: {record['error']}")
                    if "skip" in record:
                        continue
                    seen.add(str(record["p"]))
                    changed += _take(root, record, child.reader, gid)
            except (StreamError, KeyError, TypeError, ValueError) as error:
                raise MirrorError(
                    f"folder {source}: the copy made as its owner could not be read ({error})"
                ) from error
            if child.finish() != 0:
                raise MirrorError(f"folder {source} could not be read: {child.complaint()}")
        for path in have:
            if path in seen:
                continue
            try:
                parent, name = parent_of(root, path)
            except OSError:
                continue  # its folder went already
            try:
                remove_at(parent, name)
                changed += 1
            finally:
                os.close(parent)
        return changed
    finally:
        os.close(root)


def _own_folder(folder: Path, gid: int) -> None:
    """Group boxd-work may write; no one else may look (mkdir's mode would meet the umask)."""
    folder.mkdir(exist_ok=True)
    os.chown(folder, -1, gid)
    os.chmod(folder, 0o2770)


def sync_mirror(folders: list[Folder], base: Path, gid: int, asker: int) -> int:
    """One folder is the base itself; several sit side by side in it under their names, and the
    base's top is the box's, so a task cannot leave files where no real folder would take them.
    `asker`: the uid of the account that asked for the task."""
    if len(folders) == 1:
        _own_folder(base, gid)
        return sync_tree(folders[0].path, base, gid, asker)
    base.mkdir(exist_ok=True)
    os.chmod(base, 0o755)
    changed = 0
    for folder in folders:
        part = base / folder.name
        _own_folder(part, gid)
        changed += sync_tree(folder.path, part, gid, asker)
    return changed
