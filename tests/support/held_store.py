"""The store's thread held by a test, so writes pile up for one group commit."""

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from boxd.manager.record.store import Store

HOLD_SECONDS = 10.0


@asynccontextmanager
async def thread_held(store: Store) -> AsyncIterator[None]:
    """The store's thread is busy until the block ends: what is written meanwhile waits."""
    started, release = threading.Event(), threading.Event()

    def hold(db: sqlite3.Connection) -> None:
        started.set()
        release.wait(HOLD_SECONDS)

    holding = asyncio.create_task(store._run(hold))
    await asyncio.to_thread(started.wait, HOLD_SECONDS)
    assert started.is_set()
    try:
        yield
    finally:
        release.set()
        await holding


async def arrived(store: Store, count: int) -> None:
    """Waits until `count` writes wait for a commit (each caller has reached its await)."""
    for _ in range(1000):
        if len(store._waiting) >= count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{len(store._waiting)} writes arrived, not {count}")


def commits(statements: list[str]) -> int:
    return sum(statement == "COMMIT" for statement in statements)
