"""boxd restarts while tasks run: systemd keeps the units, the manager picks them up again."""

from testbed.box_api import finish, lose_worker_with_boxd, start_fake, wait_for_step
from testbed.machine import Machine


def test_boxd_restarted_while_a_task_runs(machine: Machine, token: str) -> None:
    task = start_fake(machine, token, "step before\nsleep 3\nstep after")
    wait_for_step(machine, task["id"])
    machine.run("systemctl", "restart", "boxd.service")
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["before", "slept 3 s", "after"]


def test_a_task_that_ends_while_boxd_is_down(machine: Machine, token: str) -> None:
    """The worker goes on to its last step only once boxd is stopped (the test ends its
    `sleep`): a fixed sleep raced `systemctl stop`, which a busy machine may take longer for."""
    task = start_fake(machine, token, "step before\nsh sleep 600 || true\nstep after")
    wait_for_step(machine, task["id"])
    machine.run("systemctl", "stop", "boxd.service")
    try:
        sleep = machine.run("pgrep", "-u", task["user"], "-x", "sleep").stdout.split()[0]
        machine.run("kill", sleep)
        # The worker's next step waits in its broker until the manager is back.
        machine.run("sleep", "3")
        unit = f"box-task-{task['id']}.service"
        assert machine.run("systemctl", "is-active", unit, check=False).stdout.strip() == "active"
    finally:
        machine.run("systemctl", "start", "boxd.service")
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["before", "Terminated", "after"]


def test_a_worker_lost_with_boxd_resumes_from_its_steps(machine: Machine, token: str) -> None:
    """As after a power cut: the unit is gone, so boxd starts the worker again, and it carries
    on after the last line it had logged."""
    task = start_fake(machine, token, "step one\nsleep 3\nstep two")
    wait_for_step(machine, task["id"])
    lose_worker_with_boxd(machine, task["id"])
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["one", "slept 3 s", "two"]
