"""What the manager asks of the machine for a task besides systemd's units and its workspace's
layers: its user, its network namespace and its home made and removed, its worker started ahead
read from /proc, the disk's room. One object handed to Box and its parts, so that a test gives
stand-ins here rather than patching the modules that do it."""

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from boxd.manager.record.disk import disk_full
from boxd.manager.units import netns, task_home, users, worker_ahead
from boxd.wire.ids import task_user

log = logging.getLogger(__name__)


@dataclass
class TaskOS:
    ensure_user: Callable[[str, Path, int], Awaitable[None]] = users.ensure_user
    # Why the user could not be removed, or None.
    remove_user: Callable[[str], Awaitable[str | None]] = users.remove_user
    ensure_netns: Callable[[str], Awaitable[Path]] = netns.ensure
    remove_netns: Callable[[str], Awaitable[None]] = netns.remove
    # The tasks that have a namespace here. Blocking: called off the event loop.
    netns_ids: Callable[[], list[str]] = netns.task_ids
    # (home, task id, uid, project=False): task_home.prepare.
    prepare_home: Callable[..., Awaitable[Path]] = task_home.prepare
    remove_home: Callable[[Path, str], Awaitable[None]] = task_home.remove
    # These three block: called off the event loop.
    catches: Callable[[int, Iterable[int]], bool] = worker_ahead.catches
    not_ready: Callable[[int, Path, Iterable[int]], str | None] = worker_ahead.not_ready
    disk_full: Callable[[Path], bool] = disk_full

    async def remove_task_user(self, task_id: str) -> None:
        """Removes the task's user and group; a failure is logged, not raised."""
        failed = await self.remove_user(task_user(task_id))
        if failed:
            log.warning("%s", failed)
