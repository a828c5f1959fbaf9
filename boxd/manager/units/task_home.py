"""The worker's own HOME, `BOX_HOME/tasks/<id>/home`, outside the workspace view.

HOME, and the caches and configuration under it, are where interpreters and tools look for code
to run at start-up (Python's user site-packages and usercustomize, shell rc files, git and npm
configuration). In the shared view, what one task left there would run in the next task's
worker, with that task's broker, tools and budget. Here it is the task's alone, and it goes
when the task ends.
"""

import asyncio
import os
import shutil
from pathlib import Path

from boxd.manager.units import disk_quota
from boxd.paths import task_own_home


async def prepare(home: Path, task_id: str, uid: int, project: bool = False) -> Path:
    """Makes the task's home, or finds it after a restart. Its parent is root's, so no task can
    have put anything at that path. With `project`, what is made in it counts against the
    task's disk quota (boxd.manager.units.disk_quota)."""
    path = task_own_home(home, task_id)

    def make() -> None:
        path.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchown(fd, uid, -1)
            os.fchmod(fd, 0o700)
            if project:
                disk_quota.set_project(fd, uid)
        finally:
            os.close(fd)

    await asyncio.to_thread(make)
    return path


async def remove(home: Path, task_id: str) -> None:
    """Deletes the home of a task whose worker has stopped. shutil.rmtree works from directory
    fds and never follows a link the task left in it."""
    await asyncio.to_thread(shutil.rmtree, task_own_home(home, task_id), True)
