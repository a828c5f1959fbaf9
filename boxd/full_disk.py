"""Whether an error says the disk is full, whichever layer raised it: SQLite's "database or
disk is full", or ENOSPC (EDQUOT for a quota) from a file write."""

import errno
import sqlite3


def is_full(error: BaseException) -> bool:
    if isinstance(error, sqlite3.OperationalError):
        return error.sqlite_errorcode == sqlite3.SQLITE_FULL
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    return False
