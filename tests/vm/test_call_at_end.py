"""A tool that started gets its tool.result, even when its task ends while it runs: its worker
killed, or the task stopped by its owner. The chaos suite found a payment booked in the wallet's
ledger with no tool.result (seed 2338960227): the worker was killed while `wallet.pay` ran.

The race is held open exactly by a tool installed in the test machine only (the `boxd.apps`
entry point group): `gate.pass` opens a FIFO the test made and waits there; the test, which
opened the FIFO to write, knows then that the tool runs; it ends the task, sees the broker
being stopped, and lets the tool go by closing its end. The tool then notes its key in a file,
as the wallet books a payment, and answers.
"""

import json
import select
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from testbed.box_api import BOXCTL, boxctl, start_fake
from testbed.machine import Machine

PYTHON = "/usr/lib/boxd/venv/bin/python"
GATE = "/var/lib/box/apps/gate"
HOLD = f"{GATE}/hold"
RAN = f"{GATE}/ran"
TOOL = "gate.pass"

APP = '''"""gate.pass, for tests only: waits at a FIFO the test holds, then notes its key as run."""

import asyncio
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from boxd.sdk import App, Context, Tool


class Nothing(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _wait_then_note(state_dir: Path, key: str) -> None:
    with open(state_dir / "hold", "rb") as hold:
        hold.read()
    with open(state_dir / "ran", "a") as ran:
        ran.write(key + "\\n")
        ran.flush()
        os.fsync(ran.fileno())


async def _pass(_: Nothing, context: Context) -> dict[str, Any]:
    await asyncio.to_thread(_wait_then_note, context.state_dir, context.key)
    return {"ran": context.key}


app = App(
    name="gate",
    tools=(Tool(verb="pass", description="Waits for the test.", input=Nothing, run=_pass),),
)
'''

ENTRY_POINTS = "[boxd.apps]\ngate = boxd_test_gate:app\n"
METADATA = "Metadata-Version: 2.1\nName: boxd-test-gate\nVersion: 0\n"

RESULTS = (
    "import json, sqlite3, sys\n"
    "db = sqlite3.connect('/var/lib/box/box.db')\n"
    'rows = db.execute("SELECT kind, data FROM events WHERE task = ? AND kind IN'
    " ('tool.call', 'tool.result') ORDER BY seq\", (sys.argv[1],)).fetchall()\n"
    "print(json.dumps([[kind, json.loads(data)] for kind, data in rows]))\n"
)


@pytest.fixture(scope="module", autouse=True)
def gate_app(machine: Machine) -> Iterator[None]:
    """The gate app in boxd's venv; boxd restarted, as the manager reads the apps once."""
    site = machine.run(
        PYTHON, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    ).stdout.strip()
    module = f"{site}/boxd_test_gate.py"
    info = f"{site}/boxd_test_gate-0.dist-info"
    machine.run("mkdir", "-p", info)
    machine.run("tee", module, input=APP)
    machine.run("tee", f"{info}/entry_points.txt", input=ENTRY_POINTS)
    machine.run("tee", f"{info}/METADATA", input=METADATA)
    machine.run("systemctl", "restart", "boxd.service")
    yield
    machine.run("rm", "-rf", module, info)
    # Its runner and socket stop as boxd starts without it.
    machine.run("systemctl", "restart", "boxd.service")
    machine.run("rm", "-rf", GATE)


def hold_gate(machine: Machine) -> subprocess.Popen[str]:
    """A FIFO the tool will wait at, held open to write by a process that says `held` once the
    tool has opened it (the open returns on both sides together) and keeps it until killed."""
    # Emptied, not made anew: a runner still up from a test before sees the directory it had.
    machine.run("mkdir", "-p", GATE)
    machine.run("rm", "-f", HOLD, RAN)
    machine.run("mkfifo", "-m", "0600", HOLD)
    machine.run("chown", "-R", "boxd-app-gate:boxd-app-gate", GATE)
    return machine.spawn("sh", "-c", f'exec 3>"{HOLD}"; echo held; exec sleep infinity')


def tool_running(holder: subprocess.Popen[str], timeout: float = 60) -> None:
    assert holder.stdout is not None
    ready, _, _ = select.select([holder.stdout], [], [], timeout)
    line = holder.stdout.readline() if ready else ""
    assert line.strip() == "held", f"the tool never reached its FIFO ({line!r})"


def let_go(holder: subprocess.Popen[str]) -> None:
    holder.kill()
    holder.wait(timeout=30)


def wait_until(what: str, check: Callable[[], bool], timeout: float = 120) -> None:
    """Waits until `check` holds (a test may poll; boxd never does)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not in {timeout} s")
        time.sleep(0.05)


def broker_state(machine: Machine, task_id: str) -> str:
    unit = f"box-broker@{task_id}.service"
    return machine.run("systemctl", "show", "-p", "ActiveState", "--value", unit).stdout.strip()


def task_state(machine: Machine, task_id: str) -> str:
    return str(json.loads(boxctl(machine, "show", task_id, "--json").stdout)["state"])


def calls_and_results(machine: Machine, task_id: str) -> list[tuple[str, dict[str, Any]]]:
    rows = json.loads(machine.run(PYTHON, "-c", RESULTS, task_id).stdout)
    return [(kind, data) for kind, data in rows]


def check_every_run_has_its_result(machine: Machine, task_id: str) -> None:
    ran = machine.run("cat", RAN, check=False).stdout.split()
    assert len(ran) == 1, ran
    logged = calls_and_results(machine, task_id)
    results = [data for kind, data in logged if kind == "tool.result"]
    assert [r["key"] for r in results] == ran, (ran, logged)
    assert results[0]["ok"] is True
    assert results[0]["output"] == {"ran": ran[0]}


def end_while_the_tool_runs(machine: Machine, token: str, *end: str) -> str:
    """Starts a task whose call waits at the gate; ends it with the command `end` (`{id}` for
    the task's id); lets the tool go once the broker is being stopped; returns the task's id
    once its broker has stopped."""
    holder = hold_gate(machine)
    task = start_fake(machine, token, f"step in\ncall {TOOL}\nstep out", tools=[TOOL])
    task_id = str(task["id"])
    ending: subprocess.Popen[str] | None = None
    try:
        tool_running(holder)
        # Not waited for here: before the fix, ending waits for the broker, which waits for
        # the tool, which waits for the test.
        ending = machine.spawn(*(part.format(id=task_id) for part in end))
        wait_until("the task ended", lambda: task_state(machine, task_id) == "failed")
        # The broker is told to stop while the tool runs: the case the tool must outlive.
        wait_until("the broker stopping", lambda: broker_state(machine, task_id) != "active")
    finally:
        let_go(holder)
    wait_until("the broker stopped", lambda: broker_state(machine, task_id) == "inactive")
    if ending is not None:
        ending.communicate(timeout=120)
    return task_id


def test_a_tool_running_when_its_worker_is_killed_has_its_result_logged(
    machine: Machine, token: str
) -> None:
    task_id = end_while_the_tool_runs(
        machine, token, "systemctl", "kill", "--signal=KILL", "box-task-{id}.service"
    )
    check_every_run_has_its_result(machine, task_id)


def test_a_tool_running_when_its_task_is_stopped_has_its_result_logged(
    machine: Machine, token: str
) -> None:
    task_id = end_while_the_tool_runs(machine, token, BOXCTL, "stop", "{id}")
    check_every_run_has_its_result(machine, task_id)
