"""The manager's per-task and per-workspace locks: exclusive per key, and forgotten once free."""

import asyncio

import pytest

from boxd.manager.keyed_locks import KeyedLocks


async def test_one_key_is_held_by_one_at_a_time_and_keys_do_not_block_each_other() -> None:
    locks = KeyedLocks()
    order: list[str] = []
    release = asyncio.Event()

    async def hold(key: str, name: str) -> None:
        async with locks[key]:
            order.append(f"{name} in")
            await release.wait()
            order.append(f"{name} out")

    first = asyncio.create_task(hold("t1", "first"))
    second = asyncio.create_task(hold("t1", "second"))
    other = asyncio.create_task(hold("t2", "other"))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert order == ["first in", "other in"]
    assert len(locks) == 2
    release.set()
    await asyncio.gather(first, second, other)
    assert order.index("first out") < order.index("second in")


async def test_a_lock_is_forgotten_once_no_one_holds_or_waits_for_it() -> None:
    locks = KeyedLocks()
    for number in range(1000):
        async with locks[f"t{number}"]:
            pass
    assert len(locks) == 0


async def test_a_waiter_cancelled_or_a_holder_failing_leaves_nothing_behind() -> None:
    locks = KeyedLocks()
    held = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with locks["t1"]:
            held.set()
            await release.wait()
            raise RuntimeError("the holder failed")

    async def waiter() -> None:
        async with locks["t1"]:
            pytest.fail("a cancelled waiter never gets the lock")

    holding = asyncio.create_task(holder())
    await held.wait()
    waiting = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    release.set()
    with pytest.raises(RuntimeError, match="the holder failed"):
        await holding
    assert len(locks) == 0
