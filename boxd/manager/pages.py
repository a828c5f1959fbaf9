"""Answers that may be long (a task's steps, the tasks, the approvals) go in pages, so that no
answer depends on fitting in one D-Bus message: dbus-daemon refuses a message over
max_message_size (32 MiB by default on the system bus), whatever the tasks logged.

A page holds whole items up to PAGE_CHARS of JSON (one more if a single item is larger; every
item is capped, see boxd/reading/caps.py), and `next`, the cursor of the page after it, if there is
one. The gateway, the broker and boxctl ask page after page and put the answer together.
"""

from collections.abc import Awaitable, Callable
from typing import Any

from boxd.errors import Problem, die
from boxd.reading.decimal_text import decimal
from boxd.reading.strict_json import size

PAGE_CHARS = 4 * 1024 * 1024
# Rows read from the store at a time while filling a page: a few at first, then as many as the
# items seen so far say will fit, so neither 1 MB steps nor 10,000 small tasks cost much.
FIRST_BATCH, MAX_BATCH = 8, 500

# (position, item) in order; an item the store could not read at all is None, and skipped.
Fetch = Callable[[int | None, int], Awaitable[list[tuple[int, dict[str, Any] | None]]]]


def cursor(page: str) -> int | None:
    """The position a page starts after: none for the first page ("")."""
    if page == "":
        return None
    start = decimal(page, most_digits=19)
    if start is None:
        die(
            Problem.INVALID, f"page {page[:40]!r} is not one this box handed out: send '' or a next"
        )
    return start


async def one_page(fetch: Fetch, page: str) -> tuple[list[dict[str, Any]], str | None]:
    """Items from `fetch(after, limit)`, which answers (position, item) in order, for one page,
    and the cursor of the next page or None."""
    after = cursor(page)
    items: list[dict[str, Any]] = []
    used = 0
    limit = FIRST_BATCH
    while True:
        batch = await fetch(after, limit)
        for position, item in batch:
            if item is None:
                after = position
                continue
            shown = size(item)
            if items and used + shown > PAGE_CHARS:
                return items, str(after)
            items.append(item)
            used += shown
            after = position
        if len(batch) < limit:
            return items, None
        average = max(1, used // max(1, len(items)))
        limit = max(1, min(MAX_BATCH, (PAGE_CHARS - used) // average + 1))


def with_next(answer: dict[str, Any], following: str | None) -> dict[str, Any]:
    return {**answer, "next": following} if following is not None else answer
