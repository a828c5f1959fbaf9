"""Which queued tasks start now: at most `maxRunningTasks` hold a place (starting, running or
waiting) at once, and places go to queued tasks in the order they came."""

from collections.abc import Iterable

from boxd.wire.models.task import Task


def next_to_start(queued: Iterable[Task], holding: set[str], limit: int) -> list[Task]:
    """The queued tasks that get the free places, oldest first. `holding` are the ids of tasks
    that have a place, queued ones among them while they start."""
    free = limit - len(holding)
    waiting = sorted((t for t in queued if t.id not in holding), key=lambda t: (t.createdAt, t.id))
    return waiting[: max(free, 0)]
