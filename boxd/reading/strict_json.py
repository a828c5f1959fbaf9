"""The one reader of JSON that comes from callers: tasks, apps, the owner, any D-Bus client.

Python's json module reads `NaN`, `Infinity` and `1e999` (as inf) and integers of any size;
pydantic's reader takes the first three too. None of them is a number a person means, and an
infinity stored in a task's cost made its record unreadable (pydantic writes it as null). So
every body is read here: a number that is not finite, or an integer beyond JSON's safe range,
is refused in words that name where it was; so is a key given twice in one object, which every
reader here would take as its last value while a proxy or a log in front may read the first.
What pydantic's reader refused and Python's takes is refused here too, as nothing behind this
reader may meet it: text that is not UTF-8 (Python's guesses UTF-16 and takes encoded lone
surrogates), a lone surrogate escaped in a string (`"\\ud800"`: no character, and no store or
D-Bus message can carry it), and nesting deeper than MAX_DEPTH.
"""

import json
import math
import re
from typing import Any

from boxd.errors import Problem, die

# Integers JavaScript (and every JSON reader) keeps exactly: 2**53 - 1.
MAX_INTEGER = 9_007_199_254_740_991
# What one request may carry, body or D-Bus argument: the spec's "The body is over 10 MB".
MAX_BODY = 10 * 1024 * 1024
TOO_LARGE = "the body is over 10 MB"
# Arrays and objects one in another, the body's own included: pydantic's reader stopped at about
# this depth, and a record of events deeper than that could not be read back by it.
MAX_DEPTH = 200
# A `\\u` escape of a UTF-16 surrogate, the only way a lone one gets into UTF-8 JSON text.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class _Refused:
    """Stands where the reader met a number it refuses, until the path to it is known."""

    def __init__(self, text: str, why: str) -> None:
        self.text = text
        self.why = why

    def words(self, path: tuple[str, ...]) -> str:
        return f"{where(path)}: {self.text} {self.why}"


class _Twice(_Refused):
    """Stands for an object that gives one key twice: the refusal names the key."""

    def __init__(self, key: str) -> None:
        super().__init__(key, "is given twice; give each key once")

    def words(self, path: tuple[str, ...]) -> str:
        return f"{where((*path, self.text))} {self.why}"


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Refused:
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            return _Twice(key)
        value[key] = item
    return value


def _constant(text: str) -> _Refused:
    return _Refused(text, "is not a number")


def _float(text: str) -> float | _Refused:
    value = float(text)
    return value if math.isfinite(value) else _Refused(text, "is not a finite number")


def _int(text: str) -> int | _Refused:
    # Checked on the text first: int() of thousands of digits is slow, and refused past 4300.
    digits = len(text.lstrip("-"))
    if digits > len(str(MAX_INTEGER)) or abs(int(text)) > MAX_INTEGER:
        shown = text if len(text) <= 24 else f"{text[:10]}...({digits} digits)"
        return _Refused(shown, f"is out of range (at most {MAX_INTEGER:,} either way)")
    return int(text)


def _find(value: Any, path: tuple[str, ...]) -> tuple[tuple[str, ...], _Refused] | None:
    if isinstance(value, _Refused):
        return path, value
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _find(item, (*path, str(key)))
        if found is not None:
            return found
    return None


def _too_deep(value: Any, depth: int = 1) -> bool:
    if depth > MAX_DEPTH:
        return True
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, list):
        items = value
    else:
        return False
    return any(isinstance(item, dict | list) and _too_deep(item, depth + 1) for item in items)


def _lone_surrogate(value: Any, path: tuple[str, ...]) -> tuple[str, ...] | None:
    """The path of the first string or key holding a lone surrogate, if any."""
    if isinstance(value, str):
        return path if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if _SURROGATE.search(key):
                return (*path, key.encode("utf-8", "backslashreplace").decode())
            found = _lone_surrogate(item, (*path, key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _lone_surrogate(item, (*path, str(index)))
            if found is not None:
                return found
    return None


def where(path: tuple[str, ...]) -> str:
    return ".".join(path) or "the body"


def loads(body: str | bytes, what: str = "the body") -> Any:
    """Reads caller JSON, or raises BoxError (invalid, or too large) in one plain sentence."""
    if len(body) > MAX_BODY:
        die(Problem.TOO_LARGE, TOO_LARGE if what == "the body" else f"{what} is over 10 MB")
    refused = False

    def mark(refusal: Any) -> Any:
        nonlocal refused
        refused = refused or isinstance(refusal, _Refused)
        return refusal

    try:
        # UTF-8 only: json.loads would guess UTF-16 or UTF-32 from bytes, and decode encoded
        # surrogates.
        text = body.decode() if isinstance(body, bytes) else body
        value = json.loads(
            text,
            parse_constant=lambda text: mark(_constant(text)),
            parse_float=lambda text: mark(_float(text)),
            parse_int=lambda text: mark(_int(text)),
            object_pairs_hook=lambda pairs: mark(_object(pairs)),
        )
    except UnicodeDecodeError:
        die(Problem.INVALID, f"{what} is not UTF-8 text")
    except json.JSONDecodeError as error:
        die(Problem.INVALID, f"{what} is not valid JSON: {error}")
    except RecursionError:
        die(Problem.INVALID, f"{what} is nested too deeply")
    if refused:
        try:
            found = _find(value, ())
        except RecursionError:
            die(Problem.INVALID, f"{what} is nested too deeply")
        if found is not None:
            path, refusal = found
            die(Problem.INVALID, refusal.words(path))
    # Counted first: a body with fewer brackets than MAX_DEPTH cannot be that deep.
    if text.count("[") + text.count("{") > MAX_DEPTH and _too_deep(value):
        die(Problem.INVALID, f"{what} is nested too deeply")
    if _SURROGATE_ESCAPE.search(text):
        lone = _lone_surrogate(value, ())
        if lone is not None:
            die(Problem.INVALID, f"{where(lone)} holds a lone surrogate, so it is not UTF-8 text")
    return value


def size(value: Any) -> int:
    """The length of a value as JSON on the wire (non-ASCII escaped, as D-Bus answers are)."""
    return len(json.dumps(value, separators=(",", ":"), allow_nan=False))
