"""The owner's read access to a workspace's files through its mounted view (owner_views.py).

The view shows each file with its own owner and mode: a done layer's root folder is its task's
user's, 0700, a task may leave files 0600, and the base is 2770 root:boxd-work, while the owner's
account is in boxd-owner, not boxd-work. So boxd gives group boxd-owner read access (and search
for folders) with a POSIX ACL entry, on each folder and plain file, and nothing more:

- a done task's layer, once, as it ends: its worker is stopped, its view unmounted, so no
  process of its user is left to change it; walked by directory fds following no link, each
  file opened O_NOFOLLOW and checked with fstat, so a name swapped for a link or a FIFO is
  skipped, never followed or opened for reading;
- a base folder, as it is made and at every start, with a default ACL too, so what is put in it
  later inherits the entry.

No mode bit changes, so no other user and no task gains anything: the other users stay out at
the views' gate (0750 root:boxd-owner), and a task reads a file of an earlier task exactly as
before. Where the file already had an ACL with a mask, every entry's effective rights are baked
in before the mask is widened to let boxd-owner read, so no named user or group gains a right.
"""

import grp
import os
import stat
import struct
from pathlib import Path

from boxd.manager.folders.beneath import DIR_FLAGS, READ_FLAGS

OWNER_GROUP = "boxd-owner"
ACCESS = "system.posix_acl_access"
DEFAULT = "system.posix_acl_default"
# linux/posix_acl_xattr.h
_VERSION = 2
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_NO_ID = 0xFFFFFFFF
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
READ, SEARCH = 4, 1
# Opened to set the ACL on it, never read: no atime written (root owns or may override).
_FILE_FLAGS = READ_FLAGS | os.O_NOATIME

Entry = tuple[int, int, int]  # (tag, permissions rwx as 0-7, id)


def owner_gid() -> int | None:
    """Group boxd-owner's id, or None where it does not exist (unit tests, no installed box)."""
    try:
        return grp.getgrnam(OWNER_GROUP).gr_gid
    except KeyError:
        return None


def parse(blob: bytes) -> list[Entry]:
    """The entries of an ACL as the kernel stores it in its xattr."""
    if len(blob) < _HEADER.size or (len(blob) - _HEADER.size) % _ENTRY.size:
        raise ValueError("not a POSIX ACL")
    if _HEADER.unpack_from(blob)[0] != _VERSION:
        raise ValueError("a POSIX ACL of an unknown version")
    return [
        _ENTRY.unpack_from(blob, offset) for offset in range(_HEADER.size, len(blob), _ENTRY.size)
    ]


def build(entries: list[Entry]) -> bytes:
    ordered = sorted(entries, key=lambda entry: (entry[0], entry[2]))
    return _HEADER.pack(_VERSION) + b"".join(_ENTRY.pack(*entry) for entry in ordered)


def from_mode(mode: int) -> list[Entry]:
    """The ACL a file without one has: its mode bits."""
    return [
        (USER_OBJ, (mode >> 6) & 7, _NO_ID),
        (GROUP_OBJ, (mode >> 3) & 7, _NO_ID),
        (OTHER, mode & 7, _NO_ID),
    ]


def with_reader(entries: list[Entry], gid: int, rights: int) -> list[Entry] | None:
    """`entries` with group `gid` given `rights` more, or None if it has them already. The
    mask, if any, is first baked into the group-class entries, so that widening it gives no one
    but `gid` anything."""
    masks = [perm for tag, perm, _ in entries if tag == MASK]
    mask = masks[0] if masks else 7
    had = [perm & mask for tag, perm, ident in entries if tag == GROUP and ident == gid]
    if had and had[0] & rights == rights:
        return None
    kept: list[Entry] = []
    for tag, perm, ident in entries:
        if tag == MASK or (tag == GROUP and ident == gid):
            continue
        if tag in (USER, GROUP_OBJ, GROUP):
            perm &= mask
        kept.append((tag, perm, ident))
    kept.append((GROUP, (had[0] if had else 0) | rights, gid))
    union = 0
    for tag, perm, _ in kept:
        if tag in (USER, GROUP_OBJ, GROUP):
            union |= perm
    kept.append((MASK, union, _NO_ID))
    return sorted(kept, key=lambda entry: (entry[0], entry[2]))


def _acl_of(fd: int, name: str, mode: int) -> list[Entry] | None:
    try:
        return parse(os.getxattr(fd, name))
    except OSError as error:
        if error.errno != getattr(os, "ENODATA", 61):
            raise
    return from_mode(mode) if name == ACCESS else None


def grant(fd: int, gid: int, default: bool = False) -> bool:
    """Gives `gid` read access (and search, for a folder) to the open file `fd`; with `default`,
    also what is made in the folder later. True if anything changed."""
    info = os.fstat(fd)
    folder = stat.S_ISDIR(info.st_mode)
    rights = READ | SEARCH if folder else READ
    changed = False
    current = _acl_of(fd, ACCESS, info.st_mode)
    assert current is not None
    wider = with_reader(current, gid, rights)
    if wider is not None:
        os.setxattr(fd, ACCESS, build(wider))
        changed = True
    if default and folder:
        inherited = _acl_of(fd, DEFAULT, info.st_mode) or from_mode(info.st_mode)
        wider = with_reader(inherited, gid, rights)
        if wider is not None:
            os.setxattr(fd, DEFAULT, build(wider))
            changed = True
    return changed


def open_to_owner(root: Path, gid: int) -> int:
    """Gives `gid` read access to every folder and plain file under `root` (a joined layer, as
    it joins); links, FIFOs, sockets, devices and whiteouts are left as they are. Walked by
    directory fds, one held per level; returns how many were changed."""
    changed = 0
    top = os.open(root, DIR_FLAGS)
    # Each level: its folder's fd and the names of the folders in it still to walk.
    levels: list[tuple[int, list[str]]] = []
    try:
        changed += grant(top, gid)
        levels.append((top, _files_then_folders(top, gid, counter := [0])))
        changed += counter[0]
        while levels:
            fd, folders = levels[-1]
            if not folders:
                levels.pop()
                if fd != top:
                    os.close(fd)
                continue
            name = folders.pop()
            try:
                inner = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # gone, or swapped for a link or a file since it was listed
            if not stat.S_ISDIR(os.fstat(inner).st_mode):
                os.close(inner)
                continue
            changed += grant(inner, gid)
            counter = [0]
            levels.append((inner, _files_then_folders(inner, gid, counter)))
            changed += counter[0]
    finally:
        for fd, _ in levels:
            if fd != top:
                os.close(fd)
        os.close(top)
    return changed


def _files_then_folders(folder: int, gid: int, counter: list[int]) -> list[str]:
    """Grants the plain files in `folder`; returns the names of the folders in it."""
    folders: list[str] = []
    with os.scandir(folder) as entries:
        for entry in entries:
            try:
                kind = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(kind):
                folders.append(entry.name)
            elif stat.S_ISREG(kind):
                try:
                    fd = os.open(entry.name, _FILE_FLAGS, dir_fd=folder)
                except OSError:
                    continue  # gone, or swapped for a link since it was listed
                try:
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        counter[0] += grant(fd, gid)
                finally:
                    os.close(fd)
    return folders
