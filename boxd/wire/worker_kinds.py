"""The worker table: which module runs each kind of worker, and the signal the manager sends a
spare's worker started ahead (boxd/workers/ahead.py) to become it. Shared by the manager, which
writes the worker's command line and sends the signal (boxd/manager/units/worker_unit.py,
boxd/manager/spares.py), and the worker started ahead, which waits for one of WAKES."""

import signal
from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    module: str
    wake: signal.Signals


# By Worker's value (boxd/wire/models/task_request.py).
WORKERS = {
    "fake": Kind("boxd.workers.fake", signal.SIGUSR1),
    "droid": Kind("boxd.workers.droid.worker", signal.SIGUSR2),
    "claude": Kind("boxd.workers.claude.worker", signal.SIGWINCH),
}
WAKES = frozenset(kind.wake for kind in WORKERS.values())
