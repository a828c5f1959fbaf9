"""Task ids made ahead: a few ids, each with its user and its network namespace already made, so
a task that takes one starts without waiting for groupadd, useradd and ip (some 100 ms of its
start; bench/start_latency.py).

A spare weakens none of what a task's user promises (users.py): its uid is claimed from the
store like any task's, never handed out before and never again. Until a task takes it, what runs
as it is boxd's own worker started ahead (boxd/workers/ahead.py), which writes nothing, and what
it owns is its empty home, made as a task's is: it is new and holds nothing of anyone's. Its
broker and worker started ahead take some 100 ms of Python, imports and sandbox off the start
of the task that takes it. A spare left when boxd stops has no task and never will: the next
manager removes its units, user and namespace (`leftovers`) rather than trust what it finds.
Spares are made one at a time, as boxd starts and after a task took one, beside that task's own
start.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from boxd.manager.users import FIRST_UID, LAST_UID
from boxd.wire.ids import is_task_id, new_task_id

log = logging.getLogger(__name__)

# How many ids are kept ready: tasks started together beyond this make their users as they
# start, as every task did before.
SPARES = 2


class Spares:
    def __init__(
        self,
        make: Callable[[str], Awaitable[None]],
        drop: Callable[[str], Awaitable[None]],
        count: int = SPARES,
    ) -> None:
        self._make = make
        self._drop = drop
        self._count = count
        self._ready: list[str] = []
        self._filling: asyncio.Task[None] | None = None

    def take(self) -> str | None:
        """A ready id, whose user and namespace are made, or None. Call `fill_soon` once the
        task that took it has started, so that making the next does not slow that start."""
        return self._ready.pop(0) if self._ready else None

    def ready(self) -> list[str]:
        return list(self._ready)

    def discard(self, task_id: str) -> bool:
        """Takes a ready id out of the spares, to be dropped and made again (its worker ended,
        say); False if it is not ready, taken by a task or never made."""
        if task_id not in self._ready:
            return False
        self._ready.remove(task_id)
        return True

    def give_back(self, task_id: str) -> None:
        """An id taken for a task that was not recorded after all: still no one's."""
        self._ready.insert(0, task_id)

    def fill_soon(self) -> None:
        if self._filling is None or self._filling.done():
            self._filling = asyncio.create_task(self._fill())

    async def filled(self) -> None:
        """Returns once the making under way, if any, is over."""
        if self._filling is not None:
            await asyncio.shield(self._filling)

    async def _fill(self) -> None:
        while len(self._ready) < self._count:
            task_id = new_task_id()
            try:
                await self._make(task_id)
            except Exception as error:
                # Tasks still start without spares; the next take tries again.
                log.warning("could not make a spare task id ready: %s", _words(error))
                await self._drop_quietly(task_id)
                return
            self._ready.append(task_id)

    async def _drop_quietly(self, task_id: str) -> None:
        try:
            await self._drop(task_id)
        except Exception as error:
            log.warning("could not remove spare %s: %s", task_id, _words(error))

    async def drop_leftovers(self, task_ids: Iterable[str]) -> None:
        for task_id in task_ids:
            await self._drop_quietly(task_id)


def leftovers(
    accounts: Iterable[tuple[str, int]], namespaces: Iterable[str], tasks: set[str]
) -> list[str]:
    """The ids of spares an earlier manager made, or began to make, and no task took: task
    users and groups (box-<id>, with an id of boxd's) and task namespaces whose id has no task."""
    found = {
        name.removeprefix("box-")
        for name, number in accounts
        if name.startswith("box-") and FIRST_UID <= number <= LAST_UID
    }
    found.update(namespaces)
    return sorted(task_id for task_id in found if is_task_id(task_id) and task_id not in tasks)


def _words(error: Exception) -> str:
    message = getattr(error, "message", None)
    return message if isinstance(message, str) else str(error) or type(error).__name__
