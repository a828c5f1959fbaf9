"""Spare task users and namespaces, made ahead so a task starts sooner (boxd/manager/spares.py),
in a real box. A spare must be as new as any task's user: one left by a manager that was killed
is removed by the next, never handed to a task, and a task that takes a spare works as its own
user in its own namespace."""

import json
import time

from tests.vm.box_api import boxctl, finish, start_fake
from tests.vm.machine import Machine


def task_users(machine: Machine) -> set[str]:
    listed = machine.run("getent", "passwd").stdout.splitlines()
    return {line.split(":", 1)[0] for line in listed if line.startswith("box-t")}


def namespaces(machine: Machine) -> set[str]:
    """The network namespaces there are, by name (a task's is named as its user)."""
    listed = machine.run("ip", "netns", "list").stdout.splitlines()
    return {line.split(" ", 1)[0] for line in listed if line}


def known_tasks(machine: Machine) -> set[str]:
    """The users of every task boxd has (boxctl list pages through them all)."""
    return {task["user"] for task in json.loads(boxctl(machine, "list", "--json").stdout)}


def spares(machine: Machine, timeout: float = 30) -> set[str]:
    """The spare users boxd has ready now: task users of no task; waits for them to be made."""
    deadline = time.monotonic() + timeout
    while not (found := task_users(machine) - known_tasks(machine)):
        assert time.monotonic() < deadline, "boxd made no spare task user"
        time.sleep(0.1)
    return found


def test_a_spare_left_by_a_killed_manager_is_removed_and_never_used(
    machine: Machine, token: str
) -> None:
    before = spares(machine)
    machine.run("systemctl", "kill", "--signal=KILL", "boxd.service")
    machine.run(
        "timeout",
        "60",
        "sh",
        "-c",
        "until systemctl is-active -q boxd.service; do sleep 0.05; done",
    )
    # The next manager removes each spare's user, then its namespace (boxd/manager/box.py).
    deadline = time.monotonic() + 60
    while left := (task_users(machine) | namespaces(machine)) & before:
        assert time.monotonic() < deadline, f"spares {left} still there after a restart"
        time.sleep(0.1)
    task = start_fake(machine, token, "sh id -un")
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert task["user"] not in before
    # The task ran as its own user, whether it took a new spare or made its user then.
    assert ended["steps"][0]["text"] == task["user"]
