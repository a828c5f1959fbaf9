"""One error type for everything a person or a client should read.

The problem code travels over D-Bus as the error name and picks the HTTP status in the gateway,
so a refusal reads the same whichever door it came through. And whether an error says the disk
is full (Problem.FULL), whichever layer raised it: SQLite's "database or disk is full", or ENOSPC
(EDQUOT for a quota) from a file write.
"""

import errno
import sys
from enum import StrEnum
from typing import NoReturn


class Problem(StrEnum):
    INVALID = "Invalid"
    NOT_FOUND = "NotFound"
    UNAUTHORIZED = "Unauthorized"
    FORBIDDEN = "Forbidden"
    TOO_LARGE = "TooLarge"
    FAILED = "Failed"
    UNAVAILABLE = "Unavailable"
    # The box's disk is full: nothing was written; the same request succeeds once there is room.
    FULL = "Full"

    @property
    def dbus_name(self) -> str:
        return f"org.boxd.Box1.Error.{self.value}"

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS[self]

    @classmethod
    def from_dbus_name(cls, name: str) -> "Problem | None":
        prefix = "org.boxd.Box1.Error."
        if not name.startswith(prefix):
            return None
        try:
            return cls(name.removeprefix(prefix))
        except ValueError:
            return None


_HTTP_STATUS = {
    Problem.INVALID: 400,
    Problem.NOT_FOUND: 404,
    Problem.UNAUTHORIZED: 401,
    Problem.FORBIDDEN: 403,
    Problem.TOO_LARGE: 413,
    Problem.FAILED: 500,
    Problem.UNAVAILABLE: 503,
    Problem.FULL: 507,
}


class BoxError(Exception):
    def __init__(self, problem: Problem, message: str) -> None:
        super().__init__(message)
        self.problem = problem
        self.message = message


def die(problem: Problem, message: str) -> NoReturn:
    raise BoxError(problem, message)


# POST /api/tasks on a full disk (the 507 of openapi.py names it too).
NO_ROOM_TO_START = (
    "The box's disk is full: a new task needs room for its changes and its record, so none "
    "was started. Free space on the box (undo tasks or remove workspaces you no longer need), "
    "then start it again."
)


def is_full(error: BaseException) -> bool:
    # Only a process that imported sqlite3 can meet its errors: a task's broker, which keeps no
    # database, does not load SQLite for this check, whose import every start would pay
    # (docs/performance.md, "What a process's imports cost").
    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is not None and isinstance(error, sqlite3.OperationalError):
        return bool(error.sqlite_errorcode == sqlite3.SQLITE_FULL)
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    return False
