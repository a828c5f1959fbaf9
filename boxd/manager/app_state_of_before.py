"""The apps' state as a box of before kept it, made ready to be handed to each app's own user.

Before the apps' runners, every app ran as boxd-broker in every broker, and BOX_HOME/apps was
that user's: any app's code could hard-link another app's files into its own folder, or make the
folder of an app not installed yet. systemd's StateDirectory= then gives each folder, with every
inode in it, to its app's user (box-app@.service): a link made before would hand one app the
other's ledger, and a folder made ahead would be a later app's state. So, once, as the box is
upgraded and before any runner starts (the old brokers stopped): a file that has other names gets
a copy of its own in its place, and a folder of no installed app (or anything but a folder) is
moved to BOX_HOME/apps-of-before, root's alone, for the owner to look at.

Root works here in a folder its old user controlled, so it goes by directory fds and follows no
link; nothing else writes there meanwhile.
"""

import contextlib
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_COPY_CHUNK = 1 << 20


@contextlib.contextmanager
def _opened(name: str | Path, flags: int, dir_fd: int | None = None) -> Iterator[int]:
    fd = os.open(name, flags, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def split_state(apps: Path, installed: frozenset[str], aside: Path) -> list[str]:
    """Makes `apps` (BOX_HOME/apps, still the brokers') safe to hand out: what was moved to
    `aside`, and each file given a copy of its own, as lines for the log."""
    done: list[str] = []
    with _opened(apps, _DIRECTORY) as folder:
        for name in sorted(os.listdir(folder)):
            kind = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
            if stat.S_ISDIR(kind) and name in installed:
                with _opened(name, _DIRECTORY, folder) as state:
                    done += [f"{name}/{part}" for part in _unshare(state)]
                continue
            aside.mkdir(mode=0o700, exist_ok=True)
            with _opened(aside, _DIRECTORY) as put:
                target = _free_name(put, name)
                os.rename(name, target, src_dir_fd=folder, dst_dir_fd=put)
            done.append(f"{name} moved to {aside / target}")
    for line in done:
        log.warning("apps' state of before: %s", line)
    return done


def _free_name(folder: int, name: str) -> str:
    candidate, number = name, 1
    while True:
        try:
            os.stat(candidate, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return candidate
        number += 1
        candidate = f"{name}.{number}"


def _unshare(folder: int) -> list[str]:
    """Gives each file below `folder` that has other names a copy of its own."""
    unshared: list[str] = []
    for name in sorted(os.listdir(folder)):
        found = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISDIR(found.st_mode):
            with _opened(name, _DIRECTORY, folder) as below:
                unshared += [f"{name}/{part}" for part in _unshare(below)]
        elif stat.S_ISREG(found.st_mode) and found.st_nlink > 1:
            _copy_in_place(folder, name, found)
            unshared.append(f"{name} had other names: it is a copy of its own now")
    return unshared


def _copy_in_place(folder: int, name: str, found: os.stat_result) -> None:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with _opened(name, flags, folder) as source:
        if not stat.S_ISREG(os.fstat(source).st_mode):
            return  # swapped meanwhile: nothing writes here now, so not ours to copy
        temporary = _free_name(folder, ".unshared")
        create = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with _opened(temporary, create, folder) as copy:
            os.fchmod(copy, stat.S_IMODE(found.st_mode))
            os.fchown(copy, found.st_uid, found.st_gid)
            while os.copy_file_range(source, copy, _COPY_CHUNK):
                pass
            os.fsync(copy)
    os.rename(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
