"""How much a caller may put in one field. Every text and JSON value a task, an app or the owner
sends is capped, so no record, log line or answer grows without bound; docs/limits.md lists them
all.

The caps of a task request (title, prompt, hosts, files, ...) are docs/spec/start-a-task.txt's,
in task_request.py; a key and a question are approval.py's.

Each check takes a value and returns it, or raises BoxError in a sentence that names the field:
the broker's requests are read with them as they are (boxd.reading.json_reader), the manager's
records with them as pydantic validators (boxd.wire.models.plain_errors.checked), so a broker
imports no pydantic.
"""

import math
from collections.abc import Callable
from typing import Any

from boxd.errors import Problem, die
from boxd.reading.strict_json import size

# One cost, one tool call's cost, one question's cost: $10,000,000. Far above any budget
# (at most 100,000 cents), and small enough that no sum of them ever stops being a number.
MAX_CENTS = 1_000_000_000
# Each token count of one /usage.
MAX_TOKENS = 1_000_000_000
# A step's text, in characters: a line of progress, or a command's output.
MAX_STEP_TEXT = 20_000
# JSON values: a step's data, a tool call's input, a tool's output, as compact JSON on the wire.
MAX_DATA = 1024 * 1024
MAX_DATA_WORDS = "1 MB"
# Names and short labels: a cost's `what`, a model, a tool's name, a payee, a purpose.
MAX_LABEL = 200
# A tool's error text.
MAX_ERROR = 4000
# Tools one task may name.
MAX_TOOLS = 50


def text(field: str, limit: int) -> Callable[[object], str]:
    """A string of at most `limit` characters."""

    def check(value: object) -> str:
        if not isinstance(value, str):
            die(Problem.INVALID, f"{field} must be a string")
        if len(value) > limit:
            die(Problem.INVALID, f"{field} is over {limit:,} characters")
        return value

    return check


def data(field: str, limit: int = MAX_DATA) -> Callable[[object], Any]:
    """Any JSON value of at most `limit` characters as compact JSON."""

    def check(value: object) -> Any:
        try:
            shown = size(value)
        except (TypeError, ValueError, RecursionError):
            die(Problem.INVALID, f"{field} is not a JSON value")
        if shown > limit:
            die(Problem.INVALID, f"{field} is over {MAX_DATA_WORDS} as JSON ({shown:,} characters)")
        return value

    return check


def cents(value: object, field: str = "costCents") -> float:
    """US cents, 0 to MAX_CENTS, not rounded: never NaN, an infinity, or past the cap."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_CENTS
    ):
        die(Problem.INVALID, f"{field} must be a number of US cents from 0 to {MAX_CENTS:,}")
    return float(value)


def cents_of(field: str) -> Callable[[object], float]:
    """cents() for a field named otherwise than costCents."""
    return lambda value: cents(value, field)
