"""Brokers, the manager and the HTTP gateway killed with SIGKILL, in a real box: a worker's
request whose answer was lost is sent again (a step logged once), and no unit is locked out by
systemd's start limit however often it is killed."""

import json
import time

from testbed.box_api import boxctl, finish, http, start_fake, wait_for_step
from testbed.machine import CommandError, Machine

KILLS = 10


def _unit_of(task_id: str) -> str:
    return f"box-broker@{task_id}.service"


def _wait_in_machine(machine: Machine, condition: str, timeout: float = 30) -> None:
    """Polls a shell condition in the machine (a test may poll; boxd itself never does)."""
    machine.run(
        "timeout",
        str(timeout),
        "sh",
        "-c",
        f"until {condition}; do sleep 0.02; done",
        timeout=timeout + 10,
    )


def _request_queued_at_broker(machine: Machine, task_id: str) -> None:
    """Waits until the worker's request sits unread in the (stopped) broker's socket: ss shows
    a receive queue above zero on the broker's side. A Unix connection's accepted end is in the
    connecting side's network namespace, the task's own, so ss looks there."""
    worker = _main_pid(machine, f"box-task-{task_id}.service")
    sock = f"/var/lib/box/tasks/{task_id}/broker.sock"
    ss = f"nsenter -t {worker} -n ss -xaH"
    try:
        _wait_in_machine(machine, f"{ss} | awk '$3 > 0 && $5 == \"{sock}\"' | grep -q .")
    except CommandError:
        print(machine.run("sh", "-c", ss).stdout)
        raise


def _release_sleep(machine: Machine, task: dict[str, str]) -> None:
    """Ends the `sleep 600` the task's script runs, so its worker goes on to its next line."""
    pid = machine.run("pgrep", "-u", task["user"], "-x", "sleep").stdout.split()[0]
    machine.run("kill", pid)


def _steps(machine: Machine, task_id: str) -> list[str]:
    shown = json.loads(boxctl(machine, "show", task_id, "--json").stdout)
    return [s["text"] for s in shown["steps"]]


def test_a_step_lost_with_its_broker_is_sent_again(machine: Machine, token: str) -> None:
    """The broker is frozen, the worker's step reaches its socket, and the broker is killed
    before reading it: the worker's connection drops, and it sends the step again to the broker
    systemd starts anew. (On main the worker failed: "Connection reset by peer".)"""
    script = "step one\nsh sleep 600 || true\nstep two"
    task = start_fake(machine, token, script)
    wait_for_step(machine, task["id"])
    unit = _unit_of(task["id"])
    machine.run("systemctl", "kill", "--signal=STOP", unit)
    _release_sleep(machine, task)
    _request_queued_at_broker(machine, task["id"])
    machine.run("systemctl", "kill", "--signal=KILL", unit)
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["one", "Terminated", "two"]


def test_a_step_committed_as_its_broker_died_is_logged_once(machine: Machine, token: str) -> None:
    """The manager is frozen, so the broker passes the step on and waits for its answer; the
    broker is killed, the manager goes on and commits the step. The worker never heard so: it
    finds the step in GET /task and does not send it a second time."""
    script = "step one\nsh sleep 600 || true\nstep two"
    task = start_fake(machine, token, script)
    wait_for_step(machine, task["id"])
    manager = _main_pid(machine, "boxd.service")
    restarts = _restarts(machine, "boxd.service")
    machine.run("kill", "-STOP", manager)
    try:
        _release_sleep(machine, task)
        # The broker read the step and asked the manager, whose bus connection now holds a
        # message it has not read (boxd has a network namespace of its own: ss looks there).
        ss = f"nsenter -t {manager} -n ss -xHp | grep 'pid={manager},'"
        _wait_in_machine(machine, f"{ss} | awk '$3 > 0' | grep -q .")
        machine.run("systemctl", "kill", "--signal=KILL", _unit_of(task["id"]))
    finally:
        machine.run("kill", "-CONT", manager)
    ended = finish(machine, task["id"])
    # A manager frozen past its watchdog (WatchdogSec=30) is killed and started again: the
    # test then proved nothing about a manager that goes on, and left the next test a box that
    # was still starting ("boxd is not running" when its token was made).
    assert _main_pid(machine, "boxd.service") == manager, (
        "the frozen manager was killed by its watchdog: the machine was too slow for this test"
    )
    assert _restarts(machine, "boxd.service") == restarts
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["one", "Terminated", "two"]


def _main_pid(machine: Machine, unit: str) -> str:
    return machine.run("systemctl", "show", "-p", "MainPID", "--value", unit).stdout.strip()


def _restarts(machine: Machine, unit: str) -> int:
    return int(machine.run("systemctl", "show", "-P", "NRestarts", unit).stdout)


def _kill_and_wait_back(machine: Machine, unit: str) -> float:
    """kill -9 the unit's main process and wait until systemd has it running again under a new
    one; returns the seconds that took."""
    before = _main_pid(machine, unit)
    assert before != "0", f"{unit} is not running"
    started = time.monotonic()
    machine.run("kill", "-KILL", before)
    _wait_in_machine(
        machine,
        f'[ "$(systemctl show -p MainPID --value {unit})" != {before} ] && '
        f'[ "$(systemctl show -p MainPID --value {unit})" != 0 ] && '
        f"systemctl is-active -q {unit}",
    )
    return time.monotonic() - started


def test_killed_ten_times_in_a_row_every_unit_comes_back(machine: Machine, token: str) -> None:
    waiting = start_fake(machine, token, "step one\nask go on?\nstep after")
    wait_for_step(machine, waiting["id"])
    broker = _unit_of(waiting["id"])
    for unit in ("boxd.service", "boxd-web.service", broker):
        if unit == "boxd-web.service":
            # Socket-activated: started by the first request after boot.
            http(machine, "GET", "/api/tasks", token)
        seconds = [_kill_and_wait_back(machine, unit) for _ in range(KILLS)]
        print(
            f"\n{unit}: back after kill -9 in "
            f"{', '.join(f'{s:.2f}' for s in seconds)} s "
            f"(median {sorted(seconds)[KILLS // 2]:.2f} s)"
        )
    status, tasks = http(machine, "GET", "/api/tasks", token)
    assert status == 200, tasks
    approval = f"{waiting['id']}.line-2"
    boxctl(machine, "approve", approval)
    ended = finish(machine, waiting["id"])
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["one", "approved", "after"]
    later = start_fake(machine, token, "step still here")
    assert finish(machine, later["id"])["state"] == "done"
