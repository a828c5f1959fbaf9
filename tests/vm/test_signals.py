"""Who sent it: a local user with no rights (`nobody`) against boxd's signals on the system bus.

Anyone may send a signal straight to a connection's unique name, and it arrives whatever match
rules say; anyone may also ask the bus for every broadcast signal. So the broker, `boxctl follow`
and the manager act only on signals from the unique name that owns org.boxd.Box1 (or
org.freedesktop.systemd1), and boxd's signals, which carry task content, reach only root, the
owner's group and the brokers.
"""

import contextlib
import json
import select
import subprocess
import time

from testbed.box_api import BOXCTL, boxctl, finish, start_fake
from testbed.bus_signals import PYTHON, STRANGER_SCRIPT, Ear, forge, main_pid
from testbed.machine import Machine, MachineProcess
from testbed.wallet_calls import WALLET, bookings, pending

SYSTEMD = "/org/freedesktop/systemd1"
LEDGER = "/var/lib/box/apps/wallet/ledger.db"


def listen(
    machine: Machine, *argv: str, user: str, env: dict[str, str] | None = None
) -> MachineProcess:
    # stderr is left in its pipe: what is heard is on stdout (dbus-monitor, say, tells on
    # stderr that it falls back to eavesdropping).
    return machine.spawn(*argv, user=user, env=env)


def first_line(process: MachineProcess, timeout: float = 30) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    assert ready, f"{process.args!r} said nothing in {timeout} s"
    return process.stdout.readline()


def heard(process: MachineProcess) -> str:
    """All the process printed on stdout after its first line, once it is stopped."""
    process.terminate()
    assert process.stdout is not None
    text = process.stdout.read()
    process.wait(timeout=10)
    return text


def payments(machine: Machine, task_id: str) -> list[tuple[str, int]]:
    """The wallet's bookings for the task; none while the wallet has never paid anything."""
    if machine.run("test", "-e", LEDGER, check=False).returncode != 0:
        return []
    return bookings(machine, task_id)


def state(machine: Machine, task_id: str) -> str:
    return str(json.loads(boxctl(machine, "show", task_id, "--json").stdout)["state"])


def test_a_forged_answer_approves_no_payment(machine: Machine, token: str) -> None:
    task = start_fake(
        machine, token, 'call wallet.pay {"to": "Mallory", "cents": 500}\nstep after', tools=WALLET
    )
    approval = pending(machine, task["id"])
    broker = main_pid(machine, f"box-broker@{task['id']}.service")
    # What boxd itself announces when the owner approves, sent straight to the broker by nobody.
    forged = {"seq": 99, "task": task["id"], "kind": "approval", "at": time.time()}
    forged["data"] = {**approval, "state": "approved", "answeredBy": "owner"}
    path = f"/org/boxd/Box1/task/{task['id']}"
    event = [99, "approval", json.dumps(forged)]
    forge(machine, f"pid:{broker}", path, "org.boxd.Box1.Task.Event", "tss", event)
    assert state(machine, task["id"]) == "waiting"
    # The forged answer was routed before the owner's real one: a broker that believed it has
    # paid. This one is still waiting, and obeys the owner.
    boxctl(machine, "deny", approval["id"])
    ended = finish(machine, task["id"])
    assert ended["steps"][0]["text"] == "wallet.pay failed: not approved", ended
    assert payments(machine, task["id"]) == []


def test_forged_systemd_signals_end_no_task(machine: Machine, token: str) -> None:
    # The worker's shell and its sleep ignore SIGTERM, so stopping it takes systemd's whole
    # stop timeout (90 s): time for nobody to announce that the stop job is done.
    task = start_fake(machine, token, "sh trap '' TERM; sleep 600")
    unit = f"box-task-{task['id']}.service"
    user = task["user"]
    machine.run("sh", "-c", f"until pgrep -u {user} -x sleep >/dev/null; do sleep 0.05; done")
    boxd = "owner:org.boxd.Box1"
    unit_object = f"{SYSTEMD}/unit/box_2dtask_2d{task['id']}_2eservice"
    properties = "org.freedesktop.DBus.Properties.PropertiesChanged"
    changed = ["org.freedesktop.systemd1.Unit", {}, ["ActiveState", "SubState"]]
    forge(machine, boxd, unit_object, properties, "sa{sv}as", changed)
    assert state(machine, task["id"]) == "running"

    stopping = machine.spawn(BOXCTL, "stop", task["id"])
    try:
        listed = f"systemctl list-jobs --no-legend | grep -q ' {unit} '"
        machine.run("sh", "-c", f"until {listed}; do sleep 0.05; done")
        jobs = machine.run("systemctl", "list-jobs", "--no-legend", user="nobody").stdout
        job = int(next(line for line in jobs.splitlines() if f" {unit} " in line).split()[0])
        removed = [job, f"{SYSTEMD}/job/{job}", unit, "done"]
        forge(
            machine, boxd, SYSTEMD, "org.freedesktop.systemd1.Manager.JobRemoved", "uoss", removed
        )
        forge(machine, boxd, unit_object, properties, "sa{sv}as", changed)
        # A boxd that believed the forged JobRemoved ends the task at once; give it far longer
        # than that to show that it does not.
        with contextlib.suppress(subprocess.TimeoutExpired):
            stopping.wait(timeout=5)
        active = machine.run("systemctl", "is-active", unit, check=False).stdout.strip()
        assert (stopping.returncode, active) == (None, "deactivating")
        assert state(machine, task["id"]) == "running"
        # The worker really goes: now the task ends.
        machine.run("systemctl", "kill", "--signal=KILL", unit)
        assert stopping.wait(timeout=60) == 0
    finally:
        stopping.kill()
    assert state(machine, task["id"]) == "failed"


def test_a_stranger_hears_nothing_of_a_task(machine: Machine, token: str, owner: str) -> None:
    secret = f"s{time.time_ns()}"
    title, step, question = f"title-{secret}", f"step-{secret}", f"question-{secret}"
    listener = (PYTHON, "-c", STRANGER_SCRIPT, "listen")
    ears = {
        "owner": Ear(machine, "owner", owner, *listener),
        "nobody": Ear(machine, "nobody", "nobody", *listener),
        # Refused BecomeMonitor, it falls back to asking to eavesdrop with match rules.
        "dbus-monitor": Ear(machine, "dbus-monitor", "nobody", "dbus-monitor", "--system"),
        "busctl monitor": Ear(machine, "busctl", "nobody", "busctl", "monitor"),
    }
    try:
        ears["owner"].ready("listening")
        ears["nobody"].ready("listening")
        ears["dbus-monitor"].ready("NameAcquired")

        task = start_fake(machine, token, f"step {step}\nask {question}", title=title)
        following = machine.spawn(BOXCTL, "follow", task["id"], user=owner)
        approval = pending(machine, task["id"])
        path = f"/org/boxd/Box1/task/{task['id']}"
        get = ("busctl", "get-property", "org.boxd.Box1", path, "org.boxd.Box1.Task", "Title")
        call = ("busctl", "call", "org.boxd.Box1")
        for reading in (
            get,
            (*call, path, "org.freedesktop.DBus.Properties", "GetAll", "s", "org.boxd.Box1.Task"),
            (*call, "/", "org.freedesktop.DBus.ObjectManager", "GetManagedObjects"),
        ):
            refused = machine.run(*reading, user="nobody", check=False)
            assert refused.returncode != 0 and "Access denied" in refused.stderr, refused
        assert title in machine.run(*get, user=owner).stdout
        unit = f"box-task-{task['id']}.service"
        described = machine.run("systemctl", "show", "-p", "Description", unit, user="nobody")
        # A stranger's calls are still answered, with boxd's own refusal.
        listed = boxctl(machine, "list", user="nobody", check=False)
        assert "Only the box's owner may do this" in listed.stderr
        # Coming back, boxd puts every task's object on the bus again, properties and all.
        machine.run("systemctl", "restart", "boxd.service")
        boxctl(machine, "approve", approval["id"], user=owner)
        followed, _ = following.communicate(timeout=60)
        assert step in followed, followed
        # The same listener, run by the owner, hears the task: it would hear a leak.
        owner_heard = ears["owner"].heard()
        assert all(text in owner_heard for text in (title, step, question)), owner_heard
        for name in ("nobody", "dbus-monitor", "busctl monitor"):
            text = ears[name].heard()
            assert secret not in text, f"{name} heard:\n{text}"
        assert title not in described.stdout
    finally:
        for ear in ears.values():
            ear.stop()


def test_a_waiting_broker_hears_the_answer_after_boxd_restarts(
    machine: Machine, token: str, owner: str
) -> None:
    script = 'step before\ncall wallet.pay {"to": "Ada", "cents": 500}\nstep paid'
    task = start_fake(machine, token, script, tools=WALLET)
    approval = pending(machine, task["id"])
    following = listen(
        machine, BOXCTL, "follow", task["id"], user=owner, env={"PYTHONUNBUFFERED": "1"}
    )
    # follow listens before it shows the steps logged so far.
    assert "before" in first_line(following)
    machine.run("systemctl", "restart", "boxd.service")
    # The broker waits 150 s before it answers `pending` and the worker asks again; the task
    # ends well before that only if the broker heard the owner from boxd's new unique name.
    boxctl(machine, "approve", approval["id"], user=owner)
    ended = finish(machine, task["id"], timeout=60)
    assert ended["state"] == "done", ended
    assert payments(machine, task["id"]) == [("line-2", 500)]
    assert following.wait(timeout=30) == 0
    followed = heard(following)
    assert "paid" in followed and "-> done" in followed, followed
