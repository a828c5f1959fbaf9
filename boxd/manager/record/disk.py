"""The box's disk: when it is full, and the space boxd keeps back for its own record.

A task's writes reach the disk through its overlay, which writes with the mounting process's
(root's) credentials, so a task can take ext4's root-reserved blocks too; and through its home,
as its own user, which takes all of a file system made with no root reserve. Nothing in the file
system keeps space for boxd. boxd keeps its own: a file of RESERVE_BYTES beside the database,
given up the moment the database cannot grow, so the manager can still record that tasks failed
and why, and made again once there is room.
"""

import errno
import os
from pathlib import Path

MIB = 1024 * 1024
RESERVE_BYTES = 16 * MIB
# Below this much space left for ordinary writes, a task that fails is told the disk is full:
# twice the reserve, so it holds just after the reserve is given up, too.
FULL_BELOW_BYTES = 2 * RESERVE_BYTES

DISK_FULL = (
    "The box's disk is full: the task could not write what it needed. Its changes were thrown "
    "away, which gives back the space they took; free more space on the box (undo tasks or "
    "remove workspaces you no longer need) before starting it again."
)


def disk_full(path: Path) -> bool:
    found = os.statvfs(path)
    return found.f_bavail * found.f_frsize < FULL_BELOW_BYTES


def full_words(error: str) -> str:
    return f"{DISK_FULL} ({error})"


def stopped_words(mib: int) -> str:
    return (
        f"The box's disk is full, and this task's files (its changes and its home) took the "
        f"most of it ({mib} MiB): boxd stopped it and threw them away to free the space. Start "
        "it again once the box has room for what it writes."
    )


def tree_bytes(top: Path) -> int:
    """The disk space a directory tree takes. Through directory fds, never following a link:
    the tree is a task's, and it may swap a directory for a link while root counts."""
    total = 0
    try:
        for _, _, files, fd in os.fwalk(top, follow_symlinks=False):
            for name in files:
                try:
                    total += os.stat(name, dir_fd=fd, follow_symlinks=False).st_blocks * 512
                except OSError:
                    continue
    except OSError:
        pass
    return total


def reserve_path(database: Path) -> Path:
    return database.with_name(database.name + "-reserve")


def make_reserve(database: Path) -> bool:
    """Makes the reserve if it is missing and there is room for it and to spare."""
    path = reserve_path(database)
    if path.exists():
        return True
    found = os.statvfs(path.parent)
    if found.f_bavail * found.f_frsize < RESERVE_BYTES + FULL_BELOW_BYTES:
        return False
    part = path.with_name(path.name + ".part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
        os.fsync(fd)
    except OSError as error:
        os.close(fd)
        part.unlink(missing_ok=True)
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            return False
        raise
    os.close(fd)
    part.rename(path)
    return True


def give_up_reserve(database: Path) -> bool:
    """Frees the reserve; whether there was one to free."""
    try:
        reserve_path(database).unlink()
    except FileNotFoundError:
        return False
    return True
