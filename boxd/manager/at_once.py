"""Steps that do not depend on one another, run at once: a task's start makes its user, its
home, its view of the workspace and its network namespace side by side, each mostly waiting on
a program of its own (useradd, mount, ip)."""

import asyncio
from collections.abc import Awaitable


async def at_once(*steps: Awaitable[object]) -> None:
    """Runs the steps at once and returns when all are over. If any failed, raises the first
    failure in the order given, but only once every other step is over too: whoever undoes them
    (a task's end) then finds each one made or not made, never still being made. A step is never
    cut off half-way, which would leave a program such as useradd running on its own."""
    results = await asyncio.gather(*steps, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
