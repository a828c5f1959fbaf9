"""boxd restarts while tasks run: systemd keeps the units, the manager picks them up again."""

from tests.vm.box_api import finish, lose_worker_with_boxd, start_fake, wait_for_step
from tests.vm.machine import Machine


def test_boxd_restarted_while_a_task_runs(machine: Machine, token: str) -> None:
    task = start_fake(machine, token, "step before\nsleep 3\nstep after")
    wait_for_step(machine, task["id"])
    machine.run("systemctl", "restart", "boxd.service")
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["before", "slept 3 s", "after"]


def test_a_task_that_ends_while_boxd_is_down(machine: Machine, token: str) -> None:
    task = start_fake(machine, token, "step before\nsleep 1\nstep after")
    wait_for_step(machine, task["id"])
    machine.run("systemctl", "stop", "boxd.service")
    # The worker's last step waits in its broker until the manager is back.
    machine.run("sleep", "3")
    unit = f"box-task-{task['id']}.service"
    assert machine.run("systemctl", "is-active", unit, check=False).stdout.strip() == "active"
    machine.run("systemctl", "start", "boxd.service")
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["before", "slept 1 s", "after"]


def test_a_worker_lost_with_boxd_resumes_from_its_steps(machine: Machine, token: str) -> None:
    """As after a power cut: the unit is gone, so boxd starts the worker again, and it carries
    on after the last line it had logged."""
    task = start_fake(machine, token, "step one\nsleep 3\nstep two")
    wait_for_step(machine, task["id"])
    lose_worker_with_boxd(machine, task["id"])
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["one", "slept 3 s", "two"]
