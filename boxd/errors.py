"""One error type for everything a person or a client should read.

The problem code travels over D-Bus as the error name and picks the HTTP status in the gateway,
so a refusal reads the same whichever door it came through.
"""

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
