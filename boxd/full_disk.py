"""Whether an error says the disk is full, whichever layer raised it: SQLite's "database or
disk is full", or ENOSPC (EDQUOT for a quota) from a file write."""

import errno
import sys

# POST /api/tasks on a full disk (the 507 of openapi.py names it too).
NO_ROOM_TO_START = (
    "The box's disk is full: a new task needs room for its changes and its record, so none "
    "was started. Free space on the box (undo tasks or remove workspaces you no longer need), "
    "then start it again."
)


def is_full(error: BaseException) -> bool:
    # Only a process that imported sqlite3 can meet its errors: a task's broker, which keeps no
    # database, does not load SQLite for this check (0.4 MiB and some 4 ms of each start).
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is not None and isinstance(error, sqlite3.OperationalError):
        return bool(error.sqlite_errorcode == sqlite3.SQLITE_FULL)
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    return False
