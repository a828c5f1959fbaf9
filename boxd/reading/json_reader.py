"""Reads the fields of a caller's JSON object, each by its own check, in plain words that name
the bad field: the broker's request bodies (a step, an ask, a cost, a usage, a call), which a
broker reads with every start and so reads without pydantic's import and model machinery.

A request's rules are a function of its fields in their order; the first refusal is the
request's, as pydantic reported them: each field in order (missing, or refused by its check),
then a field the request does not have.
"""

from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from boxd.errors import Problem, die
from boxd.reading.strict_json import loads, where

T = TypeVar("T")
Check = Callable[[Any], T]


def refuse(message: str) -> NoReturn:
    die(Problem.INVALID, message)


def body(raw: str | bytes) -> "Fields":
    """A request's body: one JSON object, read by strict_json (no body reads as `null`)."""
    return Fields(loads(raw or b"null"))


class Fields:
    """One JSON object's fields, read in order; `done()` refuses the fields left unread."""

    def __init__(self, value: object, path: tuple[str, ...] = ()) -> None:
        if not isinstance(value, dict):
            refuse(
                f"{where(path)}: input should be an object"
                if path
                else "the body must be a JSON object"
            )
        self._value: dict[str, Any] = value
        self._path = path
        self._read: set[str] = set()

    def path(self, field: str) -> tuple[str, ...]:
        return (*self._path, field)

    def required(self, field: str, check: Check[T]) -> T:
        self._read.add(field)
        if field not in self._value:
            refuse(f"{where(self.path(field))} is missing")
        return check(self._value[field])

    def optional(self, field: str, check: Check[T], default: T) -> T:
        """`default` when the field is not given; `default` is not checked."""
        self._read.add(field)
        return check(self._value[field]) if field in self._value else default

    def checked_default(self, field: str, check: Check[T], default: object) -> T:
        """As optional, but `default` is checked as a given value is (a key must be given: its
        check refuses the empty default in its own words)."""
        self._read.add(field)
        return check(self._value.get(field, default))

    def nullable(self, field: str, check: Check[T]) -> T | None:
        """None when the field is not given or `null`."""
        self._read.add(field)
        value = self._value.get(field)
        return None if value is None else check(value)

    def done(self) -> None:
        for field in self._value:
            if field not in self._read:
                refuse(f"unknown field {where(self.path(field))}")
