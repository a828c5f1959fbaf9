"""Whether a spare's worker, started ahead (boxd/workers/ahead.py), may be woken for its task:
it catches the signal that wakes it, so the signal does not kill it, and it sees the task's view
mounted on its working directory, in its own mount namespace, so it does not run on an empty
directory. Read from /proc as root; the worker cannot hide or fake either."""

import os
import signal
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")


def caught_signals(status: str) -> set[int]:
    """The signals a process catches, from the SigCgt line of its /proc/<pid>/status."""
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == "SigCgt":
            mask = int(value.strip(), 16)
            return {
                number for number in range(1, mask.bit_length() + 1) if mask >> (number - 1) & 1
            }
    return set()


def _unescaped(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    for escape, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escape, char)
    return field


def top_mount(mountinfo: str, path: Path) -> str | None:
    """The file system type of the last mount made on `path` (the one seen there), from a
    /proc/<pid>/mountinfo, or None when nothing is mounted on it."""
    found = None
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) < 10 or "-" not in fields[6:]:
            continue
        separator = fields.index("-", 6)
        if _unescaped(fields[4]) == str(path) and separator + 1 < len(fields):
            found = fields[separator + 1]
    return found


def catches(pid: int, wakes: Iterable[int], proc: Path = PROC) -> bool:
    """Whether the process catches all of `wakes`: a worker started ahead does once its imports
    are done."""
    try:
        status = (proc / str(pid) / "status").read_text()
    except OSError:
        return False
    return set(wakes) <= caught_signals(status)


def not_ready(pid: int, view: Path, wakes: Iterable[int], proc: Path = PROC) -> str | None:
    """Why the worker started ahead as `pid` cannot be woken, or None when it can."""
    try:
        status = (proc / str(pid) / "status").read_text()
        mountinfo = (proc / str(pid) / "mountinfo").read_text()
    except OSError as error:
        return f"its process {pid} cannot be read: {error.strerror or error}"
    missing = set(wakes) - caught_signals(status)
    if missing:
        return f"it does not yet catch {signal.Signals(min(missing)).name}"
    # The kernel writes the path it mounted on, with no link in it: a BOX_HOME reached through a
    # link would never match as given. Only root can change these directories.
    mounted = top_mount(mountinfo, Path(os.path.realpath(view)))
    if mounted != "overlay":
        return f"it does not see the task's view on {view}"
    return None
