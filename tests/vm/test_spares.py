"""Spare task users and namespaces, and their brokers, made ahead so a task starts sooner
(boxd/manager/spares.py), in a real box. A spare must be as new as any task's user: one left by a
manager that was killed is removed by the next, units and all, never handed to a task, and a task
that takes a spare works as its own user in its own namespace, with a broker that holds the vault
as it is when the task starts, not as it was when the spare was made."""

import json
import time

from tests.vm.box_api import BOXCTL, BROKER_UNIT, boxctl, finish, start_fake, unit_environment
from tests.vm.machine import Machine
from tests.vm.test_approval_binding import post


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


def broker_units(machine: Machine, spare: str) -> set[str]:
    """The spare's broker units systemd has loaded, active or not."""
    task_id = spare.removeprefix("box-")
    listed = machine.run(
        "systemctl", "list-units", "--all", "--plain", "--no-legend", f"*@{task_id}.*"
    ).stdout.splitlines()
    return {line.split()[0] for line in listed if line.strip()}


def brokers_ready(machine: Machine, timeout: float = 30) -> set[str]:
    """The spares, once each one's broker runs, ahead of its task."""
    deadline = time.monotonic() + timeout
    while True:
        found = spares(machine)
        running = {
            spare
            for spare in found
            if machine.run(
                "systemctl",
                "is-active",
                "-q",
                f"box-broker@{spare.removeprefix('box-')}.service",
                check=False,
            ).returncode
            == 0
        }
        if running == found:
            return found
        assert time.monotonic() < deadline, f"the brokers of {found - running} never started"
        time.sleep(0.1)


def test_a_spare_left_by_a_killed_manager_is_removed_and_never_used(
    machine: Machine, token: str
) -> None:
    before = brokers_ready(machine)
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
    # Their brokers' units went before their users, whose sockets they were.
    assert not set().union(*(broker_units(machine, spare) for spare in before))
    task = start_fake(machine, token, "sh id -un")
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert task["user"] not in before
    # The task ran as its own user, whether it took a new spare or made its user then.
    assert ended["steps"][0]["text"] == task["user"]


def credentials(machine: Machine, task_id: str) -> set[str]:
    """The credentials systemd loaded into the task's broker, by name."""
    listed = machine.run("ls", f"/run/credentials/box-broker@{task_id}.service", check=False)
    return set(listed.stdout.split())


def test_a_task_taking_a_spare_gets_the_vault_as_it_is_not_as_it_was(
    machine: Machine, token: str
) -> None:
    old = spares(machine)
    machine.run(BOXCTL, "vault", "set", "test.removed", input="old")
    # New spares, whose brokers start with test.removed and without test.new.
    machine.run("systemctl", "restart", "boxd.service")
    deadline = time.monotonic() + 60
    while (before := brokers_ready(machine)) & old:
        assert time.monotonic() < deadline, "the spares were not made again"
        time.sleep(0.1)
    for spare in before:
        assert "vault_test.removed.cred" in credentials(machine, spare.removeprefix("box-"))
    boxctl(machine, "vault", "rm", "test.removed")
    machine.run(BOXCTL, "vault", "set", "test.new", input="new")
    task = start_fake(machine, token, "sleep 60")
    try:
        assert task["user"] in before, "the task took no spare made before the change"
        deadline = time.monotonic() + 30
        unit = f"box-broker@{task['id']}.service"
        while machine.run("systemctl", "is-active", "-q", unit, check=False).returncode:
            assert time.monotonic() < deadline, "the task's broker never started"
            time.sleep(0.1)
        loaded = credentials(machine, task["id"])
        assert "vault_test.new.cred" in loaded
        assert "vault_test.removed.cred" not in loaded
    finally:
        boxctl(machine, "stop", task["id"], check=False)
        boxctl(machine, "vault", "rm", "test.new", check=False)


def test_a_task_taking_a_spare_gets_the_broker_unit_as_it_is_after_a_reload(
    machine: Machine, token: str
) -> None:
    """An owner who changes box-broker@.service (a drop-in, then daemon-reload) has every task
    started from then on get it, whether its id was a spare whose broker started before: here
    a wait for the owner's OK of 0.3 s rather than 150, so a question is answered pending at
    once (before the fix, it waited the 150 s of the broker started ahead)."""
    before = brokers_ready(machine)
    with unit_environment(machine, BROKER_UNIT, "BOX_APPROVAL_WAIT_MS", "300"):
        task = start_fake(machine, token, "sleep 60")
        try:
            assert task["user"] in before, "the task took no spare made before the reload"
            status, answer = post(machine, task, "/ask", {"question": "May I?", "key": "k"})
            assert (status, answer["pending"]) == (200, True), answer
        finally:
            boxctl(machine, "stop", task["id"], check=False)
