"""Crash points, short: a round of fake tasks that log, write, pay and ask while the manager,
a broker, a worker and the gateway are killed with SIGKILL and the power is cut, then the box
held to its promises (tests/vm/chaos.py). The seed is printed; BOXD_CHAOS_SEED replays it.
bench/chaos.py runs the long version."""

from tests.vm.box_api import finish, start_fake
from tests.vm.chaos import COMPONENTS, Figures, round_seed, run_round, table
from tests.vm.machine import Machine

TASKS = 7
STRIKES = 6


def test_a_round_of_kills_and_a_power_cut_loses_nothing(machine: Machine, token: str) -> None:
    figures = Figures()
    run_round(machine, token, round_seed(), TASKS, STRIKES, figures, must_strike=tuple(COMPONENTS))
    print(table(figures))
    assert figures.problems == []
    assert figures.power_cuts >= 1


def test_an_ended_task_leaves_no_unit_active(machine: Machine, token: str) -> None:
    """Its slice too: systemd keeps an empty slice active until it is stopped, so every task
    that ended left one behind (found by the round above)."""
    task = start_fake(machine, token, "step one")
    assert finish(machine, task["id"])["state"] == "done"
    listed = machine.run(
        "systemctl", "list-units", "--plain", "--no-legend", "--state=active", "box-*"
    ).stdout
    assert [line for line in listed.splitlines() if task["id"] in line] == []


def test_what_an_ended_task_left_is_cleared_when_boxd_starts(machine: Machine, token: str) -> None:
    """The manager records a task's end, then stops its units and removes its namespace and
    home: killed in between (the round above did that), it left them for good. Here a task's
    end is recorded and its namespace, a socket in it and its home are put back, as that kill
    leaves them: boxd, started again, clears them."""
    task = start_fake(machine, token, "step one")
    assert finish(machine, task["id"])["state"] == "done"
    socket = f"box-egress-http@{task['id']}.socket"
    home = f"/var/lib/box/tasks/{task['id']}/home"
    machine.run("ip", "netns", "add", f"box-{task['id']}")
    machine.run("systemctl", "start", socket)
    machine.run("mkdir", home)
    machine.run("systemctl", "restart", "boxd.service")
    assert machine.run("systemctl", "is-active", socket, check=False).stdout.strip() != "active"
    assert machine.run("test", "-e", f"/run/netns/box-{task['id']}", check=False).returncode == 1
    assert machine.run("test", "-e", home, check=False).returncode == 1
