"""Layers built without root, for tests of what reads a workspace's stack (the diff review, the
workspace as it stands). Overlayfs's own marks (a 0/0 character device, a trusted.* xattr) need
root: here a whiteout is an empty sticky file and an opaque folder one with a user.* xattr, through
diffs.Marks."""

import os
import stat
from pathlib import Path

from boxd.manager.workspaces.diffs import Marks

OPAQUE = "user.test.opaque"


def _whiteout(info: os.stat_result) -> bool:
    return stat.S_ISREG(info.st_mode) and info.st_size == 0 and bool(info.st_mode & stat.S_ISVTX)


def _opaque(fd: int) -> bool:
    try:
        return os.getxattr(fd, OPAQUE) == b"y"
    except OSError:
        return False


MARKS = Marks(whiteout=_whiteout, opaque=_opaque)


def delete(layer: Path, name: str) -> None:
    """What overlayfs leaves in a layer for a deleted path (the test's mark: an empty sticky
    file, since a user.* xattr cannot be read from an lstat)."""
    (layer / name).parent.mkdir(parents=True, exist_ok=True)
    (layer / name).write_bytes(b"")
    os.chmod(layer / name, 0o1600)


def write(root: Path, name: str, content: str | bytes) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content)
    else:
        path.write_bytes(content)


def whiteout_at(parent: int, name: str) -> None:
    """The test's whiteout, made as owner_layer makes overlayfs's: in a folder's fd, by name."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=parent)
    try:
        os.fchmod(fd, 0o1600)
    finally:
        os.close(fd)
