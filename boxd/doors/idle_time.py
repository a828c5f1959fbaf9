"""How long a socket-activated process of boxd's (a task's broker, an app's runner) waits with
nothing in hand before it exits, as its environment sets it."""

from __future__ import annotations

import os
from collections.abc import Mapping

from boxd.reading.decimal_text import decimal

# A minute without anything in hand: the memory comes back, and the next request starts the
# process again through its socket.
DEFAULT_IDLE_MS = 60_000
# Below this, a caller poking the socket just after each exit could start the process more
# than systemd's socket trigger limit allows (20 starts in 2 s, then the socket fails for good).
SHORTEST_IDLE_MS = 500


def idle_seconds(variable: str, who: str, environ: Mapping[str, str] | None = None) -> float | None:
    """The idle time `variable` sets, in seconds; None when 0: never exit. `who` names the
    process in the error, as in "the broker"."""
    given = (os.environ if environ is None else environ).get(variable)
    if given is None:
        return DEFAULT_IDLE_MS / 1000
    milliseconds = decimal(given)
    if milliseconds is None:
        raise ValueError(
            f"{variable} must be a whole number of milliseconds (0: {who} never exits when "
            f"idle), not {given[:40]!r}"
        )
    if milliseconds == 0:
        return None
    if milliseconds < SHORTEST_IDLE_MS:
        raise ValueError(
            f"{variable} must be 0 or at least {SHORTEST_IDLE_MS} ms, not {given}: callers "
            f"could otherwise start {who} again faster than its socket allows"
        )
    return milliseconds / 1000
