"""Who may read what boxd keeps in BOX_HOME, and the one way boxd sets a mode there.

boxd.service runs with UMask=0077, so what the manager makes without saying otherwise (the
database and its -wal and -shm, manifests, layers' stores) is root's alone. These are the
directories that others must pass through, and no further than they must:

- the brokers (user boxd-broker) reach their apps' state in BOX_HOME/apps;
- each worker (its task's user) reaches its broker's socket, its home and its view in its own
  task's directory;
- the workspaces belong to group boxd-work, which every worker runs with; the workers reach them
  through their overlay views, mounted by root, and the owner through boxd (or directly, once
  made a member of boxd-work);
- layers are read by the kernel's overlay mounts as their mounter, root, and by no one else.
"""

import grp
import os
from pathlib import Path

from boxd.manager.units.worker_unit import WORK_GROUP
from boxd.paths import task_dir

BOX_HOME = 0o755
# A worker reaches its own task's directory by name; no one lists the tasks.
TASKS = 0o711
# Passed through by its worker, to its broker's sockets, its home and its view, and listed by no
# one else: what is in it is closed on its own too (its view and home 0700, the task's user; its
# upper layer 0700; its sockets 0600).
TASK = 0o711
# A view's mount point before its view is mounted, which a spare's worker waits in (layers.py):
# root's and empty, passed through and listed by no one.
MOUNT_POINT = 0o711
# BOX_HOME/workspaces, group boxd-work.
WORKSPACES = 0o750
# Each workspace's base: setgid, so what is put in it belongs to boxd-work too.
WORKSPACE = 0o2770
# Files boxd puts in a base (files shared to a task).
WORKSPACE_FILE = 0o660
LAYERS = 0o700
DATABASE = 0o600


def work_gid() -> int:
    """Group boxd-work's id, or -1 (leave the group as it is) where it does not exist: unit
    tests, which run without an installed box."""
    try:
        return grp.getgrnam(WORK_GROUP).gr_gid
    except KeyError:
        return -1


def restrict(path: Path, mode: int, gid: int = -1) -> None:
    """Gives `path` exactly `mode` (and group `gid`), through a descriptor opened without
    following a link, so a path swapped for a link changes nothing elsewhere."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if gid != -1:
            os.fchown(fd, -1, gid)
        # After the chown, which clears set-id bits.
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def task_directory(home: Path, task_id: str) -> Path:
    """The task's directory, made if it is not there, with the task's mode: its worker
    passes through to its socket, home and view; no other user lists it."""
    directory = task_dir(home, task_id)
    directory.mkdir(mode=TASK, exist_ok=True)
    restrict(directory, TASK)
    return directory
