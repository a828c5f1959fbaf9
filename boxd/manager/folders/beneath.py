"""Paths walked one name at a time from a directory's fd, following no link on the way.

This is what openat2's RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS gives, done with os.open(dir_fd=,
O_NOFOLLOW) per component: Python has no openat2 wrapper, a ctypes syscall number is
per-architecture, and the walk gives the same guarantee. Each name is checked to be one plain
component (no "/", ".", ".." or NUL), each step opens it relative to the fd of the folder before
with O_NOFOLLOW, so a folder swapped for a link on the way fails (ELOOP or ENOTDIR) instead of
leading out.
"""

import os
import shutil
import stat

# A folder, opened only to walk and list it; never through a link.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A file to read: never through a link, and a FIFO or device put in its place neither blocks the
# open (O_NONBLOCK) nor is read (callers check S_ISREG on the open fd).
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class NotBeneath(OSError):
    """A path that is not a plain relative path, or a step on it that is not a plain folder."""


def check_name(name: str) -> str:
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise NotBeneath(f"{name!r} is not a plain file name")
    return name


def split(relative: str) -> list[str]:
    return [check_name(part) for part in relative.split("/")]


def open_dir(parent: int, name: str) -> int:
    """Opens a folder in `parent` by name; a link, file or FIFO there is refused, not followed."""
    fd = os.open(check_name(name), DIR_FLAGS, dir_fd=parent)
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotBeneath(f"{name} is not a folder")
    return fd


def open_path(absolute: str) -> int:
    """Opens an absolute folder path from / one name at a time, following no link."""
    if not absolute.startswith("/"):
        raise NotBeneath(f"{absolute} is not an absolute path")
    fd = os.open("/", DIR_FLAGS)
    for part in absolute.strip("/").split("/") if absolute.strip("/") else []:
        try:
            next_fd = open_dir(fd, part)
        finally:
            os.close(fd)
        fd = next_fd
    return fd


def parent_of(root: int, relative: str) -> tuple[int, str]:
    """The fd of the folder that holds `relative` (the caller closes it) and the last name."""
    *folders, name = split(relative)
    fd = os.dup(root)
    for part in folders:
        try:
            next_fd = open_dir(fd, part)
        finally:
            os.close(fd)
        fd = next_fd
    return fd, name


def open_folder(root: int, relative: str) -> int:
    """Opens the folder `relative` below `root` ("" is root itself), following no link."""
    if relative == "":
        return os.dup(root)
    parent, name = parent_of(root, relative)
    try:
        return open_dir(parent, name)
    finally:
        os.close(parent)


def lstat_at(parent: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None


def remove_at(parent: int, name: str) -> None:
    """Removes a file, a link (never what it points to) or a whole folder, if it is there."""
    info = lstat_at(parent, name)
    if info is None:
        return
    if stat.S_ISDIR(info.st_mode):
        # With dir_fd, rmtree walks by fds and never follows a link (Python 3.11).
        shutil.rmtree(name, dir_fd=parent)
    else:
        os.unlink(name, dir_fd=parent)


def walk(root: int, prefix: str = "") -> list[tuple[str, os.stat_result]]:
    """(relative path, lstat) of everything under the folder `root`, parents first, by fds."""
    found: list[tuple[str, os.stat_result]] = []
    for name in sorted(os.listdir(root)):
        info = lstat_at(root, name)
        if info is None:
            continue
        found.append((prefix + name, info))
        if stat.S_ISDIR(info.st_mode):
            try:
                fd = open_dir(root, name)
            except OSError:
                continue
            try:
                found.extend(walk(fd, f"{prefix}{name}/"))
            finally:
                os.close(fd)
    return found
