"""What saving a step costs the manager's store thread, by the length of the task's prompt.

Run from the repository: `python -m bench.step_save` (`--steps`; `--against DIR` measures
another checkout, such as a worktree of main, in turn with this one). Each step is what
BrokerMethods.log_step does on the store's thread: read the task (Ledger.task), copy it with the
new step, save it with its `task.step` event (Ledger.save_task), in a transaction of its own.
Steps are of varying length, as a worker's are. Printed per step: the CPU time of the process
(the store's work alone: synchronous=OFF, so no wait for the disk is in it) and the bytes the
write-ahead log grew by (automatic checkpoints off), which is what each commit makes the disk
write and fsync.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPTS = (10, 10_000, 100_000)


def measure(steps: int) -> None:
    """In this checkout: one line per prompt length."""
    import sqlite3

    try:
        from boxd.manager.record.schema import migrate
    except ModuleNotFoundError:
        # A checkout from before the record had a version (--against one).
        from boxd.manager.record.store import _SCHEMA  # type: ignore[attr-defined]

        def migrate(db: sqlite3.Connection, path: str) -> None:  # type: ignore[misc]
            db.executescript(_SCHEMA)

    try:
        from boxd.manager.record.ledger import Ledger
        from boxd.wire.event import EventKind
        from boxd.wire.models.task import Task, TaskState
    except ModuleNotFoundError:
        # A checkout from before the ledger and boxd's shared modules had modules of their own
        # (--against one).
        from boxd.event import EventKind  # type: ignore[import-not-found,no-redef]
        from boxd.task import Task, TaskState  # type: ignore[import-not-found,no-redef]

        from boxd.manager.record.store import Ledger  # type: ignore[attr-defined]
    try:
        from boxd.manager.record.ledger import TaskSave
    except ImportError:
        # A checkout from before TaskSave (--against one): save_task took its parts as arguments.
        TaskSave = None  # type: ignore[assignment,misc]

    def save(ledger: Any, task: Any, kind: str, data: dict[str, Any], new: bool = False) -> None:
        if TaskSave is None:
            ledger.save_task(task, kind, data, new=new)
        else:
            ledger.save_task(TaskSave(task, kind, data, new=new))

    with tempfile.TemporaryDirectory(prefix="bench-step-save-") as scratch:
        for length in PROMPTS:
            path = Path(scratch) / f"box-{length}.db"
            db = sqlite3.connect(path, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=OFF")
            db.execute("PRAGMA wal_autocheckpoint=0")
            migrate(db, str(path))
            task = Task(
                id="t000000001",
                title="bench",
                prompt="p" * length,
                state=TaskState.RUNNING,
                user="box-t000000001",
                workspace="home",
                worker="fake",
                tools=[],
                hosts=[],
                source="api",
                budgetCents=100,
                createdAt=time.time(),
            )
            db.execute("BEGIN")
            save(Ledger(db), task, EventKind.TASK_STATE, {"state": "running"}, new=True)
            db.execute("COMMIT")
            wal = Path(f"{path}-wal")
            before_bytes = wal.stat().st_size
            before = time.process_time()
            for number in range(steps):
                text = f"step {number}" + "." * (number % 7)
                db.execute("BEGIN")
                ledger = Ledger(db)
                found = ledger.task(task.id)
                assert found is not None
                found = found.model_copy(update={"step": text})
                save(ledger, found, EventKind.TASK_STEP, {"text": text})
                db.execute("COMMIT")
            cpu = (time.process_time() - before) / steps
            grown = (wal.stat().st_size - before_bytes) / steps
            db.close()
            print(
                f"  prompt {length:>7,} characters: {cpu * 1e6:6.1f} µs CPU, "
                f"WAL {grown / 1024:6.1f} KiB a step"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=1000, help="steps per prompt length")
    parser.add_argument("--against", metavar="DIR", help="another checkout, measured in turn")
    parser.add_argument("--measure", action="store_true", help="measure the boxd on PYTHONPATH")
    arguments = parser.parse_args()
    if arguments.measure:
        measure(arguments.steps)
        return
    here = Path(__file__).resolve().parents[1]
    trees = [here, *([Path(arguments.against).resolve()] if arguments.against else [])]
    for tree in trees:
        print(f"{tree} ({arguments.steps} steps each)", flush=True)
        done = subprocess.run(
            # This file, measuring that checkout's boxd (which need not have this file).
            [sys.executable, __file__, "--measure", "--steps", str(arguments.steps)],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            check=False,
        )
        if done.returncode != 0:
            sys.exit(f"the measure in {tree} failed ({done.returncode})")


if __name__ == "__main__":
    main()
