"""What a task's broker answers to a body posted as the task's user, inside a machine."""

import json
from typing import Any

from testbed.machine import Machine


def post(machine: Machine, task: dict[str, Any], path: str, body: dict[str, Any]) -> Any:
    """What the task's broker answers to `body`, as (status, JSON), asked as the task's user."""
    done = machine.run(
        "curl",
        "-sS",
        "-w",
        "\n%{http_code}",
        "--unix-socket",
        f"/var/lib/box/tasks/{task['id']}/broker.sock",
        f"http://box{path}",
        "-d",
        json.dumps(body),
        user=task["user"],
        timeout=60,
    )
    text, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(text)
