"""Run inside the test machine by testbed/chaos.py (its text through `python -c`): prints as
JSON what the record, the wallet's ledger and the system hold of the task ids read on stdin.
Standard library only; read-only."""

import contextlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

BOX = "/var/lib/box"


def rows(path: str, sql: str, ids: list[str]) -> list[Any]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        marks = ",".join("?" * len(ids))
        return db.execute(sql.format(marks=marks), ids).fetchall()
    finally:
        db.close()


def output(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True).stdout


def main() -> None:
    ids = json.loads(sys.stdin.read())
    box = f"{BOX}/box.db"
    ledger = f"{BOX}/apps/wallet/ledger.db"
    tasks = rows(box, "SELECT id, record FROM tasks WHERE id IN ({marks})", ids)
    events = rows(
        box, "SELECT task, kind, data FROM events WHERE task IN ({marks}) ORDER BY seq", ids
    )
    approvals = rows(box, "SELECT record FROM approvals WHERE task IN ({marks})", ids)
    layers = rows(
        box, "SELECT workspace, number, task, active FROM layers WHERE task IN ({marks})", ids
    )
    try:
        bookings = rows(
            ledger, "SELECT task, key, payee, cents FROM bookings WHERE task IN ({marks})", ids
        )
    except sqlite3.OperationalError:
        bookings = []  # no payment yet: the ledger is made by the first
    mounts = Path("/proc/1/mountinfo").read_text()
    manager = output("systemctl", "show", "-p", "MainPID", "--value", "boxd.service").strip()
    if manager not in ("", "0"):
        with contextlib.suppress(FileNotFoundError):
            mounts += Path(f"/proc/{manager}/mountinfo").read_text()
    print(
        json.dumps(
            {
                "tasks": {i: json.loads(r) for i, r in tasks},
                "events": [[t, k, json.loads(d)] for t, k, d in events],
                "approvals": [json.loads(r) for (r,) in approvals],
                "layers": [list(r) for r in layers],
                "bookings": [list(r) for r in bookings],
                "mounts": mounts,
                "units": output(
                    "systemctl", "list-units", "--all", "--plain", "--no-legend", "box-*"
                ),
                "listening": output("ss", "-xlH"),
                "netns": output("ls", "/run/netns"),
            }
        )
    )


main()
