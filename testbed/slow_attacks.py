"""Slow clients against a machine's gateway and a task's broker at once (testbed/slow_clients.py run
inside the machine): what VM tests and bench/slow_clients.py measure."""

import json
import shutil
from pathlib import Path
from typing import Any

from testbed.box_api import start_fake, wait_for_step
from testbed.machine import Machine

SCRIPT = "/tmp/slow_clients.py"
IDLE = 2000
# Steps of almost 1 MB each: GET /task and GET /api/tasks/{id} answer some 8 MB.
BIG_STEPS = 8


def main_pid(machine: Machine, unit: str) -> int:
    return int(machine.run("systemctl", "show", "-P", "MainPID", unit).stdout.strip())


def attack(machine: Machine, config: dict[str, Any]) -> Any:
    return machine.spawn("python3", SCRIPT, json.dumps(config))


def results(process: Any) -> dict[str, Any]:
    stdout, stderr = process.communicate(timeout=180)
    assert process.returncode == 0, stderr
    found: dict[str, Any] = json.loads(stdout)
    return found


def head(method_path: str, *headers: str) -> str:
    lines = [f"{method_path} HTTP/1.1", "Host: 127.0.0.1", *headers, "Connection: close"]
    return "\r\n".join(lines) + "\r\n\r\n"


def attack_both(machine: Machine, token: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """Runs every attack on the gateway and on a fresh task's broker at once; returns what
    each measured and the task's id. Also bench/slow_clients.py's."""
    shutil.copy(Path(__file__).with_name("slow_clients.py"), machine.root / SCRIPT.lstrip("/"))
    task = start_fake(machine, token, "step up\nsleep 600")
    wait_for_step(machine, task["id"])
    sock = f"/var/lib/box/tasks/{task['id']}/broker.sock"
    steps = (
        "import json, socket, sys\n"
        "for n in range(int(sys.argv[2])):\n"
        "    body = json.dumps({'text': f'big {n}', 'data': {'pad': 'x' * 900000}}).encode()\n"
        "    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        "    s.sendall(b'POST /step HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nConnection: close\\r\\n'\n"
        "              + f'Content-Length: {len(body)}\\r\\n\\r\\n'.encode() + body)\n"
        "    assert s.makefile('rb').readline().split()[1] == b'200'\n"
    )
    machine.run("python3", "-c", steps, sock, str(BIG_STEPS), user=task["user"])
    bearer = f"Authorization: Bearer {token}"
    gateway = attack(
        machine,
        {
            "door": "tcp:127.0.0.1:7700",
            "idle": IDLE,
            "legit": head("GET /api/tasks", bearer),
            "big": head(f"GET /api/tasks/{task['id']}", bearer),
            "post": "/api/tasks",
            "headers": bearer + "\r\n",
            "pid": main_pid(machine, "boxd-web.service"),
        },
    )
    broker = attack(
        machine,
        {
            "door": f"unix:{sock}",
            "idle": IDLE,
            "legit": head("GET /tools"),
            "big": head("GET /task"),
            "post": "/step",
            "pid": main_pid(machine, f"box-broker@{task['id']}.service"),
        },
    )
    return results(gateway), results(broker), str(task["id"])
