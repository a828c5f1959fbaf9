"""Talking to the box inside a test machine the way its users do: curl, boxctl, busctl."""

import json
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from testbed.machine import Machine

BOXCTL = "/usr/lib/boxd/venv/bin/boxctl"
BROKER_UNIT = "box-broker@.service"
API = "http://127.0.0.1:7700"
# curl's words for a connection it could not make: "Couldn't connect to server" in Debian 12's
# curl 7.88, "Could not connect to server" in Debian 13's 8.14.
CURL_COULD_NOT_CONNECT = re.compile(r"Could(n't| not) connect to server")


def http(
    machine: Machine,
    method: str,
    path: str,
    token: str | None = None,
    body: str | None = None,
) -> tuple[int, Any]:
    argv = ["curl", "-sS", "-X", method, "-w", "\n%{http_code}", f"{API}{path}"]
    if token is not None:
        argv += ["-H", f"Authorization: Bearer {token}"]
    if body is not None:
        argv += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    done = machine.run(*argv, input=body, timeout=60)
    text, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(text) if text else None


def start_fake(machine: Machine, token: str, prompt: str, **fields: Any) -> dict[str, Any]:
    request = {"title": fields.pop("title", "a fake task"), "prompt": prompt, "worker": "fake"}
    status, task = http(machine, "POST", "/api/tasks", token, json.dumps({**request, **fields}))
    assert status == 201, task
    assert isinstance(task, dict)
    return task


def boxctl(
    machine: Machine, *args: str, user: str | None = None, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return machine.run(BOXCTL, *args, user=user, check=check, timeout=timeout)


def finish(machine: Machine, task_id: str, timeout: float = 90) -> dict[str, Any]:
    """Waits for the task to end (boxctl follow returns then) and returns it with its steps."""
    boxctl(machine, "follow", task_id, check=False, timeout=timeout)
    task = json.loads(boxctl(machine, "show", task_id, "--json").stdout)
    assert isinstance(task, dict)
    return task


def busctl_call(
    machine: Machine, member: str, *args: str, user: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    signature = "s" * len(args)
    argv = [
        "busctl",
        "--json=short",
        "call",
        "org.boxd.Box1",
        "/org/boxd/Box1",
        "org.boxd.Box1.Manager",
        member,
    ]
    if args:
        argv += [signature, *args]
    return machine.run(*argv, user=user, check=check)


def busctl_result(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(json.loads(done.stdout)["data"][0])


def wait_for_step(machine: Machine, task_id: str, count: int = 1, timeout: float = 30) -> None:
    """Waits until the task has logged `count` steps (a test may poll; boxd itself never does)."""
    script = (
        "import json, subprocess, sys, time\n"
        f"deadline = time.time() + {timeout}\n"
        "while time.time() < deadline:\n"
        f"    task = json.loads(subprocess.run(['{BOXCTL}', 'show', '{task_id}', '--json'],"
        " capture_output=True, text=True, check=True).stdout)\n"
        f"    if len(task['steps']) >= {count}: sys.exit(0)\n"
        "    time.sleep(0.05)\n"
        "sys.exit('no step in time')\n"
    )
    machine.run("/usr/lib/boxd/venv/bin/python", "-c", script, timeout=timeout + 10)


def database_bytes(machine: Machine) -> str:
    """The box's database and its WAL as raw text, to prove what the record does not hold."""
    return machine.run(
        "sh", "-c", "cat /var/lib/box/box.db /var/lib/box/box.db-wal 2>/dev/null", check=False
    ).stdout


def lose_worker_with_boxd(machine: Machine, task_id: str) -> None:
    """As after a power cut: boxd stopped, the task's worker killed and its unit gone; then boxd
    starts again, finds no worker unit, and starts the worker anew to resume."""
    unit = f"box-task-{task_id}.service"
    machine.run("systemctl", "stop", "boxd.service")
    machine.run("systemctl", "kill", "--signal=KILL", unit)
    machine.run("sh", "-c", f"while systemctl is-active -q {unit}; do sleep 0.05; done")
    machine.run("systemctl", "reset-failed", unit)
    machine.run("systemctl", "start", "boxd.service")


def set_unit_environment(machine: Machine, unit: str, variable: str, value: str | None) -> None:
    """Units of `unit` (a service, or a template such as box-broker@.service) started from now on
    get variable=value from a drop-in of the test's; None removes it."""
    drop_in = _drop_in(machine, unit, variable)
    if value is None:
        drop_in.unlink(missing_ok=True)
    else:
        drop_in.parent.mkdir(parents=True, exist_ok=True)
        drop_in.write_text(f"[Service]\nEnvironment={variable}={value}\n")
    machine.run("systemctl", "daemon-reload")


@contextmanager
def unit_environment(machine: Machine, unit: str, variable: str, value: str) -> Iterator[None]:
    """set_unit_environment for the block; what was set before (or nothing) comes back after."""
    drop_in = _drop_in(machine, unit, variable)
    before = drop_in.read_text().split("=", 2)[2].strip() if drop_in.exists() else None
    set_unit_environment(machine, unit, variable, value)
    try:
        yield
    finally:
        set_unit_environment(machine, unit, variable, before)


def _drop_in(machine: Machine, unit: str, variable: str) -> Path:
    return machine.root / "etc/systemd/system" / f"{unit}.d" / f"50-{variable.lower()}.conf"
