"""The wallet app's calls in a machine, as VM tests look at them: what is booked, what waits for an
approval, and approvals' waits shortened so tests see both sides."""

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.box_api import (
    BROKER_UNIT,
    boxctl,
    unit_environment,
)
from testbed.machine import Machine

WALLET = ["wallet.pay", "wallet.balance"]


@pytest.fixture(scope="module", autouse=True)
def short_approval_wait(machine: Machine) -> Iterator[None]:
    """Brokers answer `pending` after 1.5 s instead of 150 s, so tests see both sides."""
    with unit_environment(machine, BROKER_UNIT, "BOX_APPROVAL_WAIT_MS", "1500"):
        yield


def pending(machine: Machine, task_id: str, timeout: float = 30) -> dict[str, Any]:
    """The task's one pending approval, once it has asked."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mine = [
            a
            for a in json.loads(boxctl(machine, "approvals", "--json").stdout)
            if a["task"] == task_id
        ]
        if mine:
            assert len(mine) == 1, mine
            return dict(mine[0])
        time.sleep(0.1)
    raise AssertionError(f"task {task_id} asked nothing in {timeout} s")


def bookings(machine: Machine, task_id: str) -> list[tuple[str, int]]:
    script = (
        "import json, sqlite3, sys\n"
        "db = sqlite3.connect('/var/lib/box/apps/wallet/ledger.db')\n"
        "rows = db.execute('SELECT key, cents FROM bookings WHERE task = ? ORDER BY key',"
        " (sys.argv[1],)).fetchall()\n"
        "print(json.dumps(rows))\n"
    )
    done = machine.run("/usr/lib/boxd/venv/bin/python", "-c", script, task_id)
    return [(key, cents) for key, cents in json.loads(done.stdout)]
