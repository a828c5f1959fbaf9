"""A spare's worker, started ahead of its task: Python, its imports and the worker's unit with its
sandbox are ready before the task exists, so a task that takes the spare starts with a signal
rather than a unit start (docs/performance.md, "What a start saves ahead").

It waits, as the spare's user, in its view's mount point: an empty directory, root's, until the
manager mounts the task's view on it. The manager then sends it the signal of the task's worker
(boxd.wire.worker_kinds.WORKERS), which only root and the spare's own user may send, and no
process but this one runs as that user. It goes into its view (a new lookup of its working
directory, which finds the mount) and runs that worker as if started for the task.

The manager sends the signal only once this process catches it (boxd/manager/units/worker_ahead.py):
until then the signals are blocked, so one sent early waits rather than kills it.
"""

import importlib
import os
import signal
import sys
from types import ModuleType

from boxd.patches.asyncio import import_asyncio_without_ssl
from boxd.wire.worker_kinds import WAKES, WORKERS

NOT_MOUNTED = (
    "worker: the task's view of its workspace is not mounted on its working directory; "
    "the worker started ahead cannot run this task"
)


def _ignore(_signal: int, _frame: object) -> None:
    """A handler that does nothing: the wake-up fd says which signal came."""


def _wait_for_wake() -> signal.Signals:
    """Blocks until one of WAKES arrives; returns it. Each is caught (not waited for with
    sigwait), so /proc shows the manager that this process is ready for it."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        signal.set_wakeup_fd(write_end)
        for wake in WAKES:
            signal.signal(wake, _ignore)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, WAKES)
        while True:
            for number in os.read(read_end, 16):
                if number in WAKES:
                    return signal.Signals(number)
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, WAKES)
        for wake in WAKES:
            signal.signal(wake, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        os.close(read_end)
        os.close(write_end)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, WAKES)


def _enter_view() -> None:
    """Looks its working directory up again, which now finds the task's view mounted on it.
    Refuses to go on if it finds the same empty directory: the task would run on nothing."""
    before = os.stat(".").st_dev
    os.chdir(os.getcwd())
    if os.stat(".").st_dev == before:
        sys.exit(NOT_MOUNTED)


def main() -> None:
    # Before any worker's module imports asyncio: a task's processes have it without ssl.
    import_asyncio_without_ssl()
    signal.pthread_sigmask(signal.SIG_BLOCK, WAKES)
    modules: dict[signal.Signals, ModuleType] = {
        kind.wake: importlib.import_module(kind.module) for kind in WORKERS.values()
    }
    wake = _wait_for_wake()
    _enter_view()
    modules[wake].main()


if __name__ == "__main__":
    main()
