"""One asyncio lock per key (a task, a workspace), kept only while someone holds or waits for
it: a box runs tasks for years, and a lock kept for every task that ever ran is a leak."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager


class KeyedLocks:
    """`async with locks[key]:` holds the key's lock; keys do not block one another."""

    def __init__(self) -> None:
        # Each key's lock and how many hold it or wait for it.
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def __getitem__(self, key: str) -> AbstractAsyncContextManager[None]:
        return self._held(key)

    def __len__(self) -> int:
        return len(self._locks)

    @asynccontextmanager
    async def _held(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
