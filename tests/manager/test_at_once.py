"""A task's start makes its user, home, view and network namespace at once (at_once): the steps
overlap, and a failure is raised only once every other step is over, so the task's end, which
undoes them, never meets one still being made."""

import asyncio

import pytest

from boxd.manager.at_once import at_once


async def test_the_steps_run_at_the_same_time() -> None:
    """Each step waits for the other to have begun: run one after the other, neither ends."""
    began = {name: asyncio.Event() for name in ("user", "mount")}

    async def step(name: str, other: str) -> None:
        began[name].set()
        await began[other].wait()

    await asyncio.wait_for(at_once(step("user", "mount"), step("mount", "user")), 5)


async def test_a_failure_is_raised_once_the_other_steps_are_over() -> None:
    made: list[str] = []
    release = asyncio.Event()

    async def failing() -> None:
        raise OSError("mount: no such workspace")

    async def slow(name: str) -> None:
        await release.wait()
        made.append(name)

    job = asyncio.create_task(at_once(slow("user"), failing(), slow("netns")))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    # The failure is in, but the user and the namespace are still being made: not yet raised.
    assert not job.done()
    release.set()
    with pytest.raises(OSError, match="mount: no such workspace"):
        await job
    # Whoever undoes the start finds both made, neither half-way.
    assert made == ["user", "netns"]


async def test_the_first_failure_in_order_is_raised() -> None:
    async def fails(words: str) -> None:
        raise RuntimeError(words)

    with pytest.raises(RuntimeError, match=r"^first$"):
        await at_once(fails("first"), fails("second"))
