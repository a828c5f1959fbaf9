"""Spare task users and namespaces, and their brokers and workers, made ahead so a task starts
sooner (boxd/manager/spares.py), in a real box. A spare must be as new as any task's user: one
left by a manager that was killed is removed by the next, units and all, never handed to a task,
and a task that takes a spare works as its own user in its own namespace and view, with a broker
that holds the vault as it is when the task starts, not as it was when the spare was made. A
spare's worker waits as its user, in its sandbox, on an empty directory; no one but root wakes
it; a spare whose worker ended is made again, and a task whose spare's worker cannot be woken
gets a new worker."""

import json
import signal
import time

from testbed.box_api import BOXCTL, BROKER_UNIT, boxctl, finish, start_fake, unit_environment
from testbed.broker_posts import post
from testbed.machine import Machine


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


BOX_HOME = "/var/lib/box"
# The signals a worker started ahead waits for (boxd/workers/ahead.py).
WAKES = {signal.SIGUSR1, signal.SIGUSR2}


def worker_units(machine: Machine, spare: str) -> set[str]:
    """The spare's worker unit and slice, if systemd has them loaded, active or not."""
    task_id = spare.removeprefix("box-")
    listed = machine.run(
        "systemctl",
        "list-units",
        "--all",
        "--plain",
        "--no-legend",
        f"box-task-{task_id}.service",
        f"box-{task_id}.slice",
    ).stdout.splitlines()
    return {line.split()[0] for line in listed if line.strip()}


def _waiting_pid(machine: Machine, spare: str) -> int | None:
    """The pid of the spare's worker, once it waits for its wake-up signals."""
    unit = f"box-task-{spare.removeprefix('box-')}.service"
    shown = machine.run("systemctl", "show", "-P", "MainPID", unit, check=False).stdout.strip()
    if not shown.isdigit() or shown == "0":
        return None
    status = machine.run("cat", f"/proc/{shown}/status", check=False).stdout
    caught = next(
        (line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0"
    )
    waits = all(int(caught, 16) >> (number - 1) & 1 for number in WAKES)
    return int(shown) if waits else None


def workers_ready(machine: Machine, timeout: float = 30) -> dict[str, int]:
    """The spares, once each one's broker runs and its worker waits, by user: its worker's pid."""
    deadline = time.monotonic() + timeout
    while True:
        found = brokers_ready(machine)
        ready = {spare: pid for spare in found if (pid := _waiting_pid(machine, spare))}
        if ready.keys() == found:
            return ready
        assert time.monotonic() < deadline, f"the workers of {found - ready.keys()} never waited"
        time.sleep(0.1)


def test_the_worker_started_ahead_runs_the_task_in_its_view(machine: Machine, token: str) -> None:
    note = f"{BOX_HOME}/workspaces/home/ahead-note.txt"
    machine.run("sh", "-c", f"echo written by the owner > {note}")
    try:
        ready = workers_ready(machine)
        task = start_fake(
            machine,
            token,
            "sh echo $PPID; pwd; id -un; cat ahead-note.txt; grep SigBlk /proc/$PPID/status",
        )
        ended = finish(machine, task["id"])
    finally:
        machine.run("rm", "-f", note)
    assert ended["state"] == "done", ended
    assert task["user"] in ready, "the task took no spare whose worker waited"
    parent, where, user, read, blocked = ended["steps"][0]["text"].splitlines()
    # The very process that waited before the task was asked for ran it, as the task's user,
    # in its view of the workspace, with no signal left blocked for what it runs.
    assert int(parent) == ready[task["user"]]
    assert where == f"{BOX_HOME}/tasks/{task['id']}/work"
    assert user == task["user"]
    assert read == "written by the owner"
    assert int(blocked.split()[1], 16) == 0


def test_a_spares_worker_waits_as_its_user_on_an_empty_directory_and_no_stranger_wakes_it(
    machine: Machine,
) -> None:
    ready = workers_ready(machine)
    spare, pid = sorted(ready.items())[0]
    task_id = spare.removeprefix("box-")
    unit = f"box-task-{task_id}.service"
    shown = machine.run(
        "systemctl", "show", unit, "-p", "User", "-p", "ProtectSystem", "-p", "WorkingDirectory"
    ).stdout.splitlines()
    assert sorted(shown) == [
        "ProtectSystem=strict",
        f"User={spare}",
        f"WorkingDirectory={BOX_HOME}/tasks/{task_id}/work",
    ]
    # Its view's mount point, as it sees it: nothing in it, nothing mounted on it yet.
    assert machine.run("ls", "-A", f"/proc/{pid}/cwd").stdout == ""
    assert machine.run(
        "stat", "-c", "%a %U", f"{BOX_HOME}/tasks/{task_id}/work"
    ).stdout.split() == [
        "711",
        "root",
    ]
    # Another user's signal is refused: only root, through systemd, and the spare's user wake it.
    for wake in WAKES:
        refused = machine.run("kill", f"-{int(wake)}", str(pid), user="nobody", check=False)
        assert refused.returncode != 0
    assert _waiting_pid(machine, spare) == pid


# The view as the task's worker sees it: the per-mount options and the file system type of the
# last mount on its working directory.
VIEW_MOUNT = (
    "sh echo $PPID; id -un; "
    'awk -v v="$(pwd)" \'$5 == v { o = $6; for (i = 7; $i != "-"; i++) {}; t = $(i + 1) } '
    "END { print o, t }' /proc/self/mountinfo"
)


def test_a_spare_whose_worker_was_killed_is_made_again(machine: Machine, token: str) -> None:
    ready = workers_ready(machine)
    for pid in ready.values():
        machine.run("kill", "-KILL", str(pid))
    # boxd drops them, users and all, and makes new spares, whose workers wait.
    deadline = time.monotonic() + 60
    while left := task_users(machine) & ready.keys():
        assert time.monotonic() < deadline, f"spares {left} kept their killed workers"
        time.sleep(0.1)
    woken = workers_ready(machine)
    task = start_fake(machine, token, "sh echo $PPID; id -un")
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    parent, user = ended["steps"][0]["text"].splitlines()
    assert int(parent) == woken[task["user"]]
    assert user == task["user"]


def test_a_task_started_as_systemd_reloads_runs_in_no_worker_of_before(
    machine: Machine, token: str
) -> None:
    ready = workers_ready(machine)
    # A reload since the spares were made: their workers run with the unit of before. The
    # manager makes them again as the reload ends; a task that takes one before that gets a new
    # worker (tests/manager/test_spare_brokers.py, with a fake systemd, for each way). Whichever
    # comes first here, no task runs in a worker of before.
    machine.run("systemctl", "daemon-reload")
    tasks = [start_fake(machine, token, VIEW_MOUNT) for _ in ready]
    views = set()
    for task in tasks:
        ended = finish(machine, task["id"])
        assert ended["state"] == "done", ended
        parent, user, view = ended["steps"][0]["text"].splitlines()
        assert int(parent) != ready.get(task["user"])
        assert user == task["user"]
        views.add(view)
    # A worker woken sees its view as the tasks' above did, whether theirs were woken or
    # started for them: the mount that reached it from the box's namespace, with the options of
    # the one systemd binds in (this test found them different once).
    woken = workers_ready(machine)
    task = start_fake(machine, token, VIEW_MOUNT)
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    parent, _user, view = ended["steps"][0]["text"].splitlines()
    assert int(parent) == woken[task["user"]]
    assert views == {view}
    assert view.endswith(" overlay")


def test_a_spare_left_by_a_killed_manager_is_removed_and_never_used(
    machine: Machine, token: str
) -> None:
    before = set(workers_ready(machine))
    machine.run("systemctl", "kill", "--signal=KILL", "boxd.service")
    machine.run(
        "timeout",
        "60",
        "sh",
        "-c",
        "until systemctl is-active -q boxd.service; do sleep 0.05; done",
    )
    # The next manager removes each spare's user, then its namespace (boxd/manager/spares.py).
    deadline = time.monotonic() + 60
    while left := (task_users(machine) | namespaces(machine)) & before:
        assert time.monotonic() < deadline, f"spares {left} still there after a restart"
        time.sleep(0.1)
    # Their brokers' and workers' units went before their users, whose sockets and processes
    # they were, and their workers' slices with them.
    assert not set().union(*(broker_units(machine, spare) for spare in before))
    assert not set().union(*(worker_units(machine, spare) for spare in before))
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
    machine.run(BOXCTL, "vault", "set", "FACTORY_API_KEY", input="old")
    # New spares, whose brokers start with the box's FACTORY_API_KEY and without its
    # ANTHROPIC_API_KEY (a broker holds the box's secrets, and no app's).
    machine.run("systemctl", "restart", "boxd.service")
    deadline = time.monotonic() + 60
    while (before := brokers_ready(machine)) & old:
        assert time.monotonic() < deadline, "the spares were not made again"
        time.sleep(0.1)
    for spare in before:
        assert "vault_FACTORY_API_KEY.cred" in credentials(machine, spare.removeprefix("box-"))
    boxctl(machine, "vault", "rm", "FACTORY_API_KEY")
    machine.run(BOXCTL, "vault", "set", "ANTHROPIC_API_KEY", input="new")
    task = start_fake(machine, token, "sleep 60")
    try:
        assert task["user"] in before, "the task took no spare made before the change"
        deadline = time.monotonic() + 30
        unit = f"box-broker@{task['id']}.service"
        while machine.run("systemctl", "is-active", "-q", unit, check=False).returncode:
            assert time.monotonic() < deadline, "the task's broker never started"
            time.sleep(0.1)
        loaded = credentials(machine, task["id"])
        assert "vault_ANTHROPIC_API_KEY.cred" in loaded
        assert "vault_FACTORY_API_KEY.cred" not in loaded
    finally:
        boxctl(machine, "stop", task["id"], check=False)
        boxctl(machine, "vault", "rm", "ANTHROPIC_API_KEY", check=False)


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


def test_a_settings_change_to_the_workers_unit_makes_the_spares_again(machine: Machine) -> None:
    settings = json.loads(boxctl(machine, "settings", "--json").stdout)
    percent = 40 if settings["taskCPUPercent"] != 40 else 30
    ready = workers_ready(machine)
    boxctl(machine, "settings", "--json", "set", "taskCPUPercent", str(percent))
    try:
        # Every spare, those ready before and one that was being made as the settings changed
        # (begun with those of before), is made again with the new limits.
        deadline = time.monotonic() + 60
        while True:
            kept = task_users(machine) & ready.keys()
            kept |= {
                spare
                for spare in workers_ready(machine)
                if machine.run(
                    "systemctl",
                    "show",
                    "-P",
                    "CPUQuotaPerSecUSec",
                    f"box-task-{spare.removeprefix('box-')}.service",
                ).stdout.strip()
                != f"{percent * 10}ms"
            }
            if not kept:
                break
            assert time.monotonic() < deadline, f"spares {kept} kept the limits of before"
            time.sleep(0.1)
    finally:
        boxctl(
            machine, "settings", "--json", "set", "taskCPUPercent", str(settings["taskCPUPercent"])
        )


def test_a_daemon_reload_makes_the_spares_again(machine: Machine) -> None:
    # Their brokers and workers run with their units as they were before it: made again as the
    # reload ends, so the next tasks still find spares whose worker waits.
    ready = workers_ready(machine)
    machine.run("systemctl", "daemon-reload")
    deadline = time.monotonic() + 60
    while left := task_users(machine) & ready.keys():
        assert time.monotonic() < deadline, f"spares {left} were kept after the reload"
        time.sleep(0.1)
    assert workers_ready(machine).keys().isdisjoint(ready)
