"""Each task's disk quota (Settings.taskDiskQuotaBytes): its home and its changes are one
project of the file system's project quotas, limited to that many bytes, so a task that writes
too much meets EDQUOT ("Disk quota exceeded") instead of filling the box's disk.

It works where BOX_HOME's file system enforces project quotas: ext4 made with
`-O quota,project` and mounted with `prjquota`, or XFS mounted with `prjquota`. Writes through
a task's view count too: overlayfs writes with its mounter's credentials, and boxd's lack
CAP_SYS_RESOURCE (boxd.service's CapabilityBoundingSet=), the capability ext4 lets past a quota.

The project's id is the task's uid: a done task's user lives as long as its layer, which keeps
the id its files were made with, so no two tasks' files share a project. The id and the
inheritance flag are set on the folders through their fds, as root made them; every file made
in them after takes the id. The task's folders must all carry it, the overlay's work folder
too: ext4 refuses to rename a file into a folder of another project (EXDEV), and overlayfs
makes every file in its work folder first.

The kernel's interfaces, through fcntl and ctypes: FS_IOC_FSGETXATTR and FS_IOC_FSSETXATTR
(linux/fs.h), and quotactl_fd (Linux 5.14), which takes a folder's fd rather than the path of a
block device, numbered 443 on every architecture but alpha.
"""

import ctypes
import errno
import fcntl
import os
import struct
from pathlib import Path

# struct fsxattr: xflags, extsize, nextents, projid, cowextsize, 8 bytes of padding.
_FSXATTR = struct.Struct("=5I8x")
FS_IOC_FSGETXATTR = 0x801C581F
FS_IOC_FSSETXATTR = 0x401C5820
FS_XFLAG_PROJINHERIT = 0x200

QUOTACTL_FD = 443
PRJQUOTA = 2
Q_SETQUOTA = 0x800008
Q_XGETQSTATV = 0x5808
# struct fs_quota_statv (version 1): the flags say which quotas are counted and enforced.
FS_QSTATV_VERSION1 = 1
_STATV_SIZE = 160
FS_QUOTA_PDQ_ENFD = 0x20
# struct if_dqblk: limits in blocks of 1 KiB, usage, times, and which fields to set.
_DQBLK = struct.Struct("=8QI4x")
QIF_BLIMITS = 1
QUOTA_BLOCK = 1024

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

# What a file system that keeps no quotas answers (ext4 without them: ENOSYS or ESRCH), and a
# kernel before quotactl_fd (ENOSYS).
_KEEPS_NONE = (errno.ENOSYS, errno.ESRCH, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTTY)
WHERE = "ext4 made with -O quota,project and mounted with prjquota, or XFS mounted with prjquota"


def _qcmd(command: int, kind: int) -> int:
    return (command << 8) | kind


def _quotactl(fd: int, command: int, ident: int, buffer: ctypes.Array[ctypes.c_char]) -> None:
    done = _libc.syscall(
        ctypes.c_long(QUOTACTL_FD),
        ctypes.c_int(fd),
        ctypes.c_uint(_qcmd(command, PRJQUOTA)),
        ctypes.c_int(ident),
        buffer,
    )
    if done != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def _open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def why_not(home: Path) -> str | None:
    """Why tasks cannot be given a quota on `home`'s file system, or None if they can."""
    fd = _open_dir(home)
    try:
        buffer = ctypes.create_string_buffer(bytes([FS_QSTATV_VERSION1]), _STATV_SIZE)
        try:
            _quotactl(fd, Q_XGETQSTATV, 0, buffer)
            flags = struct.unpack_from("=H", buffer.raw, 2)[0]
        except OSError as error:
            if error.errno not in _KEEPS_NONE:
                return (
                    f"boxd could not ask the file system of {home} which quotas it keeps "
                    f"({error.strerror})"
                )
            flags = 0
    finally:
        os.close(fd)
    if not flags & FS_QUOTA_PDQ_ENFD:
        return f"the file system of {home} does not enforce project quotas"
    return None


def refused(home: Path, why: str) -> str:
    return (
        f"taskDiskQuotaBytes cannot be set on this box: {why}. It works where {home} is {WHERE}, "
        "on Linux 5.14 or later."
    )


def set_project(fd: int, project: int) -> None:
    """Makes the folder open as `fd`, and whatever is made in it from now on, part of
    `project`."""
    found = bytearray(_FSXATTR.size)
    fcntl.ioctl(fd, FS_IOC_FSGETXATTR, found)
    xflags, extsize, nextents, _, cowextsize = _FSXATTR.unpack(found)
    wanted = _FSXATTR.pack(xflags | FS_XFLAG_PROJINHERIT, extsize, nextents, project, cowextsize)
    fcntl.ioctl(fd, FS_IOC_FSSETXATTR, wanted)


def set_project_of(parent: Path, name: str, project: int) -> None:
    """set_project on the folder `name` in `parent`, a folder of root's, never through a link
    the task may have put there."""
    parent_fd = _open_dir(parent)
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd
        )
    finally:
        os.close(parent_fd)
    try:
        set_project(fd, project)
    finally:
        os.close(fd)


def limit(home: Path, project: int, quota_bytes: int) -> None:
    """Sets the most `project` may take of `home`'s file system."""
    blocks = -(-quota_bytes // QUOTA_BLOCK)
    wanted = _DQBLK.pack(blocks, 0, 0, 0, 0, 0, 0, 0, QIF_BLIMITS)
    buffer = ctypes.create_string_buffer(wanted, len(wanted))
    fd = _open_dir(home)
    try:
        _quotactl(fd, Q_SETQUOTA, project, buffer)
    finally:
        os.close(fd)
