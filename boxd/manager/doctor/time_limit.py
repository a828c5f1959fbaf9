"""How long boxd doctor's checks may take. Every start of a task waits for the first checks to
answer, so a check that hangs (a `mount` on a file system that does not answer, a bus that
does not reply) must not hold them: past its time it is stopped, what it ran is killed
(boxd.manager.run), and it fails in words that say which check, that it did not answer in
time, and what to look at. A check that guards the sandbox and did not answer blocks tasks, as
if it had failed (fail closed)."""

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from boxd.wire.doctor import Finding, failed

log = logging.getLogger(__name__)

T = TypeVar("T")

# One check's time: above the BPF probe's own limit (bpf_probe.PROBE_SECONDS), which systemd
# holds it to, so that its verdict is systemd's; every other check takes well under a second.
CHECK_SECONDS = 30.0
# A whole run's: clearing what runs cut off left, then the checks, each held to CHECK_SECONDS,
# and time to spare. The gate holds to it whatever the checks it was given do.
RUN_SECONDS = 2 * CHECK_SECONDS + 15


class TimeUp(Exception):
    """What was given did not end in its time; it was cancelled."""


async def within(seconds: float, awaitable: Awaitable[T]) -> T:
    """What `awaitable` answers, or TimeUp once `seconds` have passed (then it is stopped)."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    finally:
        stop(task)
    if not done:
        raise TimeUp(f"did not end in {seconds:g} s")
    return task.result()


def stop(task: "asyncio.Future[Any]") -> None:
    """Cancels a task past its time, if it has not ended, and does not wait for it: what it
    waits on may never answer, even to a cancellation."""
    if not task.done():
        task.cancel()
        task.add_done_callback(_forget)


def _forget(task: "asyncio.Future[Any]") -> None:
    """What a task stopped for its time ended with, read (else asyncio logs that no one did)."""
    if not task.cancelled() and task.exception() is not None:
        log.info("a check stopped for its time ended with: %s", task.exception())


def did_not_answer(name: str, seconds: float, look: str, *, blocks: bool) -> Finding:
    """A check that did not answer in time, in words that say what to look at."""
    then = (
        "boxd starts no task until it answers, since it guards the sandbox"
        if blocks
        else "tasks start; it only advises"
    )
    return failed(
        name,
        f"the check did not answer in {seconds:g} s, so boxd stopped it (and killed what it "
        f"ran): whether this machine has it is unknown, and {then}.",
        f"look at {look}; then `boxctl doctor` checks again.",
        blocks=blocks,
    )
