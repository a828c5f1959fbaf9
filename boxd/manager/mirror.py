"""The copy of the owner's real folders that personal tasks work on.

A personal workspace's base is a mirror of the real folders, brought up to date before each task
starts: only what changed since is copied, by size and modification time. The mirror belongs to
group boxd-work and is group-writable, so a task's own user can change its overlay copy, while
the real folders keep their owner and modes. Files keep their modification times, so what a task
saw can be compared with the real folder when the owner keeps it.
"""

import os
import shutil
import stat
from pathlib import Path

from boxd.manager.folders import Folder

# A path's state as far as the copy goes: kind, size and modification time (0 for folders, whose
# times change with their entries). Equal states are the same file; keep.py compares them too.
State = tuple[str, int, int]


def state_of(info: os.stat_result) -> State:
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        return ("dir", 0, 0)
    kind = "link" if stat.S_ISLNK(mode) else "file" if stat.S_ISREG(mode) else "other"
    return (kind, info.st_size, info.st_mtime_ns)


def remove_entry(path: Path) -> None:
    """Removes a file, a link (never what it points to) or a whole folder, if it is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _copy_entry(source: Path, target: Path, info: os.stat_result, gid: int) -> None:
    if stat.S_ISLNK(info.st_mode):
        target.symlink_to(os.readlink(source))
        os.lchown(target, -1, gid)
        os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)
    elif stat.S_ISDIR(info.st_mode):
        target.mkdir()
        os.chown(target, -1, gid)
        os.chmod(target, (stat.S_IMODE(info.st_mode) | 0o2070) & ~0o4000)
    elif stat.S_ISREG(info.st_mode):
        # Not copy2: it would also copy extended attributes, overlayfs's own among them.
        shutil.copyfile(source, target)
        os.chown(target, -1, gid)
        os.chmod(target, (stat.S_IMODE(info.st_mode) | 0o060) & ~0o6000)
        os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
    # Devices, sockets and pipes are not files a task works on; they are left out.


def sync_tree(source: Path, target: Path, gid: int) -> int:
    """Makes `target` a copy of `source`; returns how many entries were copied or removed."""
    changed = 0
    # What belongs to root stays out of the copy: the owner may not be able to read it, and
    # boxd, which can, must not hand it to a task.
    wanted = {
        entry.name: entry
        for entry in os.scandir(source)
        if entry.stat(follow_symlinks=False).st_uid != 0
    }
    for entry in os.scandir(target):
        if entry.name not in wanted:
            remove_entry(Path(entry.path))
            changed += 1
    for name, entry in wanted.items():
        info = entry.stat(follow_symlinks=False)
        mirrored = target / name
        try:
            present = mirrored.lstat()
        except FileNotFoundError:
            present = None
        if present is not None and state_of(info) != state_of(present):
            remove_entry(mirrored)
            present = None
        if present is None:
            _copy_entry(Path(entry.path), mirrored, info, gid)
            changed += 1
        if stat.S_ISDIR(info.st_mode) and not stat.S_ISLNK(info.st_mode):
            changed += sync_tree(Path(entry.path), mirrored, gid)
    return changed


def _own_folder(folder: Path, gid: int) -> None:
    """Group boxd-work may write; no one else may look (mkdir's mode would meet the umask)."""
    folder.mkdir(exist_ok=True)
    os.chown(folder, -1, gid)
    os.chmod(folder, 0o2770)


def sync_mirror(folders: list[Folder], base: Path, gid: int) -> int:
    """One folder is the base itself; several sit side by side in it under their names, and the
    base's top is the box's, so a task cannot leave files where no real folder would take them."""
    if len(folders) == 1:
        _own_folder(base, gid)
        return sync_tree(folders[0].path, base, gid)
    base.mkdir(exist_ok=True)
    os.chmod(base, 0o755)
    changed = 0
    for folder in folders:
        part = base / folder.name
        _own_folder(part, gid)
        changed += sync_tree(folder.path, part, gid)
    return changed
