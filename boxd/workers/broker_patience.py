"""How long a worker keeps asking a broker that went away, and how often.

A broker killed mid-request is started again by systemd on the next connection (socket
activation) in well under a second; a broker whose manager is away answers 503 until boxd is
back, which systemd restarts with a pause of its own (units/boxd.service). Two minutes covers
both many times over; after that the worker fails in plain words rather than wait for ever.
Standard library only: the MCP relay imports this, and starts on every Droid turn.
"""

import asyncio
import os
import time

from boxd.reading.decimal_text import decimal

PATIENCE_SECONDS = 120.0
# Tests of a broker that never comes back set this lower; boxd leaves it unset.
PATIENCE_VARIABLE = "BOX_BROKER_PATIENCE_MS"
# The first pause is short, as the broker is usually back at once; later pauses grow so that a
# box whose manager stays down is not asked many times a second by every task.
FIRST_PAUSE_SECONDS = 0.05
LONGEST_PAUSE_SECONDS = 2.0
# How often a worker asks again while the box's disk is full (a 507: nothing was done). That
# lasts until someone frees space, so without a time limit: often enough that the task goes on
# soon after, rarely enough that many waiting tasks cost the box nothing.
FULL_PAUSE_SECONDS = 1.0


def patience_seconds() -> float:
    given = os.environ.get(PATIENCE_VARIABLE)
    if given is None:
        return PATIENCE_SECONDS
    milliseconds = decimal(given)
    if not milliseconds:
        raise ValueError(f"{PATIENCE_VARIABLE} must be a whole number of milliseconds above 0")
    return milliseconds / 1000


class Patience:
    """One request's retries: `await patience.pause()` until it says the time is up."""

    def __init__(self, seconds: float | None = None) -> None:
        self.seconds = patience_seconds() if seconds is None else seconds
        self._deadline = time.monotonic() + self.seconds
        self._pause = FIRST_PAUSE_SECONDS
        self.tries = 0

    async def pause(self) -> bool:
        """Waits before the next try; False once the time is up (then do not try again)."""
        self.tries += 1
        left = self._deadline - time.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(self._pause, left))
        self._pause = min(self._pause * 2, LONGEST_PAUSE_SECONDS)
        return True
