"""Named points where the folder code can be held still, for tests that swap a path mid-copy.

Off unless boxd.service's own environment names a folder in BOXD_PAUSE_DIR (a test drop-in,
which only root can write). boxd hands the variable to the processes it runs as a folder's
owner; the owner cannot set it for them. At point NAME, if that folder holds a FIFO named NAME
(made by root), the process opens it, which waits until the test opens it to write, and reads
until the test closes it: the test knows the process is at the point, changes what it wants,
then lets it go on. No sleeps, no timing.
"""

import os
import stat
from pathlib import Path

VARIABLE = "BOXD_PAUSE_DIR"


def point_name(kind: str, relative: str) -> str:
    """The FIFO's name for a point on a path: `/` cannot be in a file name."""
    return f"{kind}-{relative.replace('/', '%')}"


def pause(name: str) -> None:
    folder = os.environ.get(VARIABLE)
    if not folder:
        return
    fifo = Path(folder) / name
    try:
        info = fifo.lstat()
    except OSError:
        return
    if not stat.S_ISFIFO(info.st_mode) or info.st_uid != 0:
        return
    with fifo.open("rb") as held:
        held.read()
