"""A task's broker exits when idle and its sockets start it again (boxd/broker/idle.py), in a
real box: the unit goes inactive, never failed; the worker's next step starts it and is logged;
an approval waiting for the owner keeps it up; a task poking its broker neither keeps it
restarting nor loses a request. BOX_BROKER_IDLE_MS is 1.5 s here (a drop-in), 60 s by default.

The attacker's tests come first."""

import json
import time
from collections.abc import Iterator

import pytest

from testbed.box_api import (
    BROKER_UNIT,
    boxctl,
    finish,
    start_fake,
    unit_environment,
    wait_for_step,
)
from testbed.machine import Machine
from testbed.outside_world import start_outside

IDLE_MS = 1500
IDLE_LINE = "nothing in hand for 1.5 s"
CURL = "curl -sf --unix-socket $BOX_SOCKET http://box/tools >/dev/null || exit 1"


@pytest.fixture(scope="module", autouse=True)
def short_idle_time(machine: Machine) -> Iterator[None]:
    with unit_environment(machine, BROKER_UNIT, "BOX_BROKER_IDLE_MS", str(IDLE_MS)):
        yield


def unit(task_id: str) -> str:
    return f"box-broker@{task_id}.service"


def shown(machine: Machine, task_id: str) -> dict[str, str]:
    done = machine.run(
        "systemctl",
        "show",
        "-p",
        "ActiveState",
        "-p",
        "Result",
        "-p",
        "NRestarts",
        "-p",
        "MainPID",
        unit(task_id),
    )
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def broker_journal(machine: Machine, task_id: str) -> list[str]:
    machine.run("journalctl", "--sync")
    done = machine.run("journalctl", "-b", "--no-pager", "-o", "cat", "-u", unit(task_id))
    return done.stdout.splitlines()


def starts(machine: Machine, task_id: str) -> int:
    """How many times systemd started the task's broker."""
    return sum(1 for line in broker_journal(machine, task_id) if line.startswith("Started "))


def wait_for_state(machine: Machine, task_id: str, state: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while shown(machine, task_id)["ActiveState"] != state:
        assert time.monotonic() < deadline, f"{unit(task_id)} not {state} in {timeout} s"
        time.sleep(0.1)


def steps(machine: Machine, task_id: str) -> list[str]:
    task = json.loads(boxctl(machine, "show", task_id, "--json").stdout)
    return [step["text"] for step in task["steps"]]


def test_a_task_poking_its_broker_keeps_it_up(machine: Machine, token: str) -> None:
    """Forty requests 0.2 s apart, over eight seconds, five idle times: the broker that served
    the first step served them all, never exiting in between."""
    task = start_fake(
        machine,
        token,
        f"step ready\nsh for i in $(seq 40); do {CURL}; sleep 0.2; done; echo poked",
    )
    task_id = task["id"]
    wait_for_step(machine, task_id)
    first = shown(machine, task_id)["MainPID"]
    assert first != "0"
    looks = 0
    while True:
        # The broker first, then the steps: while "poked" is not logged, the poking went on
        # when the broker was looked at.
        pid = shown(machine, task_id)["MainPID"]
        if len(steps(machine, task_id)) > 1:
            break
        assert pid == first, f"the broker changed from {first} to {pid} while poked"
        looks += 1
    assert looks > 3
    ended = finish(machine, task_id)
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["ready", "poked"]


def test_a_task_poking_at_the_idle_time_loses_nothing_and_never_fails_its_broker(
    machine: Machine, token: str
) -> None:
    """Requests a little over the idle time apart, some right as the broker exits: every one is
    answered (curl -f fails the script otherwise), by a broker started again by the socket; the
    unit is never failed, and systemd counted no restart (an idle exit is no failure)."""
    task = start_fake(
        machine, token, f"sh for i in $(seq 6); do {CURL}; sleep 1.6; done; echo slow"
    )
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["slow"]
    journal = broker_journal(machine, task["id"])
    # Once at the task's start, maybe once more before its worker came, once a request at most.
    assert 2 <= starts(machine, task["id"]) <= 8, journal
    assert any(IDLE_LINE in line for line in journal), journal
    assert not any("Failed with result" in line for line in journal), journal


def test_an_idle_broker_exits_and_the_next_step_starts_it_again(
    machine: Machine, token: str
) -> None:
    task = start_fake(machine, token, "step before the nap\nsleep 8\nstep after the nap")
    task_id = task["id"]
    wait_for_step(machine, task_id)
    # The worker sleeps: its broker goes, and its unit is inactive, not failed.
    wait_for_state(machine, task_id, "inactive")
    state = shown(machine, task_id)
    assert (state["Result"], state["NRestarts"], state["MainPID"]) == ("success", "0", "0")
    assert machine.run("systemctl", "is-failed", unit(task_id), check=False).returncode != 0
    for socket_unit in ("box-broker", "box-egress-http", "box-egress-socks", "box-model"):
        listening = machine.run(
            "systemctl", "show", "-p", "ActiveState", "--value", f"{socket_unit}@{task_id}.socket"
        )
        assert listening.stdout.strip() == "active", socket_unit
    assert any(IDLE_LINE in line for line in broker_journal(machine, task_id))
    started = starts(machine, task_id)
    # Its next step, on a new connection, starts it again and is logged.
    ended = finish(machine, task_id)
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["before the nap", "slept 8 s", "after the nap"]
    assert starts(machine, task_id) == started + 1, broker_journal(machine, task_id)


def test_an_approval_waiting_for_the_owner_keeps_the_broker_up(
    machine: Machine, token: str
) -> None:
    task = start_fake(machine, token, "ask May I?\nstep asked")
    task_id = task["id"]
    deadline = time.monotonic() + 30
    while not [
        a for a in json.loads(boxctl(machine, "approvals", "--json").stdout) if a["task"] == task_id
    ]:
        assert time.monotonic() < deadline, "the task asked nothing in 30 s"
        time.sleep(0.1)
    before = shown(machine, task_id)
    started = starts(machine, task_id)
    assert before["ActiveState"] == "active"
    # Three idle times and more, with the /ask in hand: the same broker, still up.
    time.sleep(3 * IDLE_MS / 1000 + 1)
    assert shown(machine, task_id) == before
    boxctl(machine, "approve", f"{task_id}.line-1")
    ended = finish(machine, task_id)
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["approved", "asked"]
    assert starts(machine, task_id) == started


# A tunnel through the task's egress proxy, opened, then silent for three idle times and more,
# then used: through the broker that opened it (bytes go by splice, boxd/broker/egress/pipe.py, with
# no request in hand on any HTTP door).
HELD_TUNNEL = (
    "import os, socket, time, urllib.parse; "
    "proxy = urllib.parse.urlsplit(os.environ['HTTP_PROXY']); "
    "s = socket.create_connection((proxy.hostname, proxy.port)); "
    "s.sendall(b'CONNECT allowed.test:80 HTTP/1.1\\r\\nHost: allowed.test:80\\r\\n\\r\\n'); "
    "print(s.recv(200).split(b'\\r\\n')[0].decode()); "
    f"time.sleep({3 * IDLE_MS / 1000 + 1}); "
    "s.sendall(b'GET /held HTTP/1.0\\r\\nHost: allowed.test\\r\\n\\r\\n'); "
    "print(s.makefile('rb').read().split(b'\\r\\n\\r\\n')[-1].decode())"
)


def test_an_open_tunnel_keeps_the_broker_up(machine: Machine, token: str) -> None:
    outside = start_outside(machine)
    try:
        task = start_fake(
            machine, token, f'step ready\nsh python3 -c "{HELD_TUNNEL}"', hosts=["allowed.test"]
        )
        wait_for_step(machine, task["id"])
        started = starts(machine, task["id"])
        ended = finish(machine, task["id"])
    finally:
        outside.kill()
        outside.wait()
    assert ended["state"] == "done", ended
    said = ended["steps"][-1]["text"]
    assert "200" in said and "hello from 80 /held" in said, said
    assert starts(machine, task["id"]) == started, broker_journal(machine, task["id"])
