"""Flushing tasks' files to disk before their steps are logged: syncfs(2) on each task's
directory, once per file system for all the steps committed together.

The store runs this before a group's BEGIN, so a step is answered only once both its files and
its log line are on disk, and twenty tasks stepping at once on one file system cost one syncfs
rather than twenty (each broker used to run its own).

The manager is root and a task's directory holds what the task wrote, so each directory is
opened by its task id relative to the tasks directory, never following a link: whatever a task
managed to put in place of its directory, root syncs nothing else for it.

Python's os module has sync() and fsync() but not syncfs(); sync() would flush every disk of
the machine.
"""

import ctypes
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from boxd.errors import BoxError, Problem, is_full

# A step refused because its files could not be flushed (the broker answers it with a 507).
STEP_NOT_FLUSHED = (
    "The box's disk is full: the task's files could not be flushed to disk, so the step was "
    "not logged. Send it again once the box has room (the owner can free space by undoing "
    "tasks or removing workspaces)."
)

_libc = ctypes.CDLL(None, use_errno=True)


def syncfs(fd: int) -> None:
    """Flushes the file system that holds the open file `fd`."""
    if _libc.syncfs(fd) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def not_flushed(task_id: str, error: OSError) -> BoxError:
    """What the step of a task whose files could not be flushed is refused with."""
    if is_full(error):
        return BoxError(Problem.FULL, STEP_NOT_FLUSHED)
    return BoxError(
        Problem.FAILED,
        f"the files of task {task_id} could not be flushed to disk ({error.strerror or error}), "
        "so the step was not logged",
    )


def _one_name(name: str) -> bool:
    """Whether `name` is one entry of the tasks directory (task ids are), not a path."""
    return name not in ("", ".", "..") and "/" not in name and "\0" not in name


class TaskFlush:
    """Flushes the file systems of tasks' directories in `tasks_dir`. `sync` is syncfs(2);
    tests count its calls through it."""

    def __init__(self, tasks_dir: Path, sync: Callable[[int], None] = syncfs) -> None:
        self._tasks_dir = tasks_dir
        self._sync = sync

    def __call__(self, task_ids: Iterable[str]) -> dict[str, BoxError]:
        """Flushes each file system that holds one of the tasks' directories, once. Returns the
        tasks whose files could not be flushed, each with its refusal; the others' are on disk."""
        wanted = list(dict.fromkeys(task_ids))
        failed: dict[str, BoxError] = {}
        try:
            tasks_fd = os.open(self._tasks_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as error:
            return {task_id: not_flushed(task_id, error) for task_id in wanted}
        # One open directory per file system (by st_dev) and the tasks it stands for.
        syncs: dict[int, tuple[int, list[str]]] = {}
        try:
            for task_id in wanted:
                if not _one_name(task_id):
                    failed[task_id] = BoxError(Problem.INVALID, f"{task_id!r} is not a task id")
                    continue
                try:
                    fd = os.open(
                        task_id,
                        os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                        dir_fd=tasks_fd,
                    )
                except OSError as error:
                    failed[task_id] = not_flushed(task_id, error)
                    continue
                try:
                    device = os.fstat(fd).st_dev
                except OSError as error:
                    os.close(fd)
                    failed[task_id] = not_flushed(task_id, error)
                    continue
                if device in syncs:
                    os.close(fd)
                    syncs[device][1].append(task_id)
                else:
                    syncs[device] = (fd, [task_id])
            for fd, tasks in syncs.values():
                try:
                    self._sync(fd)
                except OSError as error:
                    failed.update((task_id, not_flushed(task_id, error)) for task_id in tasks)
        finally:
            for fd, _ in syncs.values():
                os.close(fd)
            os.close(tasks_fd)
        return failed
