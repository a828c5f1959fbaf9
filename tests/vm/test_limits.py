"""The box's own limits: users for a long life of tasks, a place for all tasks together, and no
more tasks running at once than the machine can carry."""

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.box_api import boxctl, finish, http, start_fake
from testbed.machine import Machine

FIRST_UID = 0x7000_0000
PYTHON = "/usr/lib/boxd/venv/bin/python"

# Takes every free uid and gid of the system range, as some 850 tasks' users did on a box whose
# task users came from there.
FILL_SYSTEM_RANGE = """
import grp, pwd
users, groups = [], []
for number in range(100, 1000):
    try:
        pwd.getpwuid(number)
    except KeyError:
        users.append(f"filler{number}:x:{number}:65534::/:/usr/sbin/nologin\\n")
    try:
        grp.getgrgid(number)
    except KeyError:
        groups.append(f"filler{number}:x:{number}:\\n")
with open("/etc/passwd", "a") as f:
    f.writelines(users)
with open("/etc/group", "a") as f:
    f.writelines(groups)
"""

# What boxd's store would hold after 100,000 tasks: their uids, handed out for good.
HUNDRED_THOUSAND_TASKS = f"""
import sqlite3
db = sqlite3.connect("/var/lib/box/box.db", timeout=30)
db.execute(
    "CREATE TABLE IF NOT EXISTS task_uids (task TEXT PRIMARY KEY, uid INTEGER NOT NULL UNIQUE)"
)
with db:
    db.executemany(
        "INSERT OR IGNORE INTO task_uids (task, uid) VALUES (?, ?)",
        ((f"old{{n}}", {FIRST_UID} + n) for n in range(100_000)),
    )
"""


def _getent(machine: Machine, database: str, name: str) -> str | None:
    done = machine.run("getent", database, name, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def _until_gone(machine: Machine, name: str, timeout: float = 20) -> None:
    """The user leaves just after the task's end is recorded (a test may poll)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _getent(machine, "passwd", name) is None and _getent(machine, "group", name) is None:
            return
        time.sleep(0.1)
    raise AssertionError(f"user {name} is still there {timeout:g} s after its task ended")


@pytest.fixture
def full_system_range(machine: Machine) -> Iterator[None]:
    machine.run("cp", "-a", "/etc/passwd", "/root/passwd.before-limits")
    machine.run("cp", "-a", "/etc/group", "/root/group.before-limits")
    machine.run(PYTHON, "-c", FILL_SYSTEM_RANGE)
    try:
        yield
    finally:
        script = (
            "import re\n"
            "for path in ('/etc/passwd', '/etc/group'):\n"
            "    lines = open(path).readlines()\n"
            "    kept = [l for l in lines if not re.match(r'filler\\d+:', l)]\n"
            "    open(path, 'w').writelines(kept)\n"
        )
        machine.run(PYTHON, "-c", script)


def test_tasks_get_users_after_the_system_range_and_100000_tasks_are_gone(
    machine: Machine, token: str, full_system_range: None
) -> None:
    machine.run(PYTHON, "-c", HUNDRED_THOUSAND_TASKS, timeout=120)
    # The spare users boxd made ahead (boxd/manager/spares.py) hold uids claimed before these
    # rows were written: restarted, boxd removes them and makes new ones after the rows.
    machine.run("systemctl", "restart", "boxd.service")
    done = start_fake(machine, token, "sh id -u\nwrite mine.txt from the first")
    ended = finish(machine, done["id"])
    assert ended["state"] == "done", ended
    uid = int(ended["steps"][0]["text"])
    # Past the system range, past 100,000 uids handed out, below 2^31.
    assert FIRST_UID + 100_000 <= uid < 2**31
    user = f"box-{done['id']}"
    # Its layer is in the workspace: its user stays, so its files have a name.
    assert _getent(machine, "passwd", user) is not None
    assert _getent(machine, "group", user) == f"{user}:x:{uid}:"

    failed = start_fake(machine, token, "sh id -u\nfail on purpose")
    ended_failed = finish(machine, failed["id"])
    assert ended_failed["state"] == "failed", ended_failed
    failed_uid = int(ended_failed["steps"][0]["text"])
    # Each its own: the spares are made side by side once boxd's checks pass (not one by one
    # in the order tasks take them), so a later task may hold the lower number.
    assert failed_uid != uid and FIRST_UID + 100_000 <= failed_uid < 2**31
    # A failed task's changes are thrown away: nothing of its user's is left, nor its user.
    _until_gone(machine, f"box-{failed['id']}")

    undone = json.loads(boxctl(machine, "undo", done["id"], "--json").stdout)
    assert undone["state"] == "undone"
    # Its layer is collected once no unfinished task stacks it; then its user goes too.
    _until_gone(machine, user)

    # Numbers are never handed out again, though their users are gone.
    later = start_fake(machine, token, "sh id -u")
    ended_later = finish(machine, later["id"])
    assert ended_later["state"] == "done", ended_later
    assert int(ended_later["steps"][0]["text"]) not in (uid, failed_uid)
    # No lastlog entry at a uid near 2^31: that sparse file would claim hundreds of GB.
    size = machine.run("stat", "-c", "%s", "/var/log/lastlog", check=False).stdout.strip()
    assert not size or int(size) < 2**20, size


def _settings(machine: Machine, **changes: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for name, value in changes.items():
        done = boxctl(machine, "settings", "--json", "set", name, json.dumps(value))
        settings = json.loads(done.stdout)
    return settings


def _slice(machine: Machine, name: str, *properties: str) -> dict[str, str]:
    argv = ["systemctl", "show", name, *(f"--property={p}" for p in properties)]
    lines = machine.run(*argv).stdout.splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def _control_group(machine: Machine, unit: str, timeout: float = 30) -> str:
    """The unit's cgroup once systemd started it. A task is running once the manager asked
    systemd for its units, in one job: the worker's start waits for its broker's sockets, so
    the POST can be answered before the unit has a cgroup (seen in CI under load)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        group = _slice(machine, unit, "ControlGroup")["ControlGroup"]
        if group:
            return group
        time.sleep(0.1)
    raise AssertionError(f"{unit} has no cgroup {timeout:g} s after its task started")


def test_all_tasks_live_in_one_slice_with_the_settings_limits(machine: Machine, token: str) -> None:
    """The limits are set and read back; this machine (systemd-nspawn) does not enforce cgroup
    memory or task limits, so the test asserts the properties, not an out-of-memory kill."""
    before = json.loads(boxctl(machine, "settings", "--json").stdout)
    assert before["allTasksTasksMax"] == 16384
    pages = int(machine.run("getconf", "_PHYS_PAGES").stdout)
    assert (
        before["allTasksMemoryMaxBytes"]
        == pages * int(machine.run("getconf", "PAGESIZE").stdout) * 3 // 4
    )
    limits = _slice(machine, "box.slice", "MemoryMax", "TasksMax")
    assert limits == {
        "MemoryMax": str(before["allTasksMemoryMaxBytes"]),
        "TasksMax": "16384",
    }
    started: list[str] = []
    try:
        _settings(machine, allTasksMemoryMaxBytes=2 * 1024**3, allTasksTasksMax=4096)
        assert _slice(machine, "box.slice", "MemoryMax", "TasksMax") == {
            "MemoryMax": str(2 * 1024**3),
            "TasksMax": "4096",
        }
        task = start_fake(machine, token, "sleep 30")
        started.append(task["id"])
        unit = f"box-task-{task['id']}.service"
        group = _control_group(machine, unit)
        assert group == f"/box.slice/box-{task['id']}.slice/{unit}"
        boxctl(machine, "stop", task["id"])
        # The limits outlive boxd: it sets them again when it starts.
        machine.run("systemctl", "restart", "boxd.service")
        assert _slice(machine, "box.slice", "MemoryMax", "TasksMax") == {
            "MemoryMax": str(2 * 1024**3),
            "TasksMax": "4096",
        }
    finally:
        # Stopped whatever happened: a task left running counts against the next test's
        # maxRunningTasks.
        for task_id in started:
            boxctl(machine, "stop", task_id, check=False)
        _settings(
            machine,
            allTasksMemoryMaxBytes=before["allTasksMemoryMaxBytes"],
            allTasksTasksMax=before["allTasksTasksMax"],
        )


def _state(machine: Machine, token: str, task_id: str) -> str:
    status, task = http(machine, "GET", f"/api/tasks/{task_id}", token)
    assert status == 200, task
    return str(task["state"])


def _until_state(
    machine: Machine, token: str, task_id: str, state: str, timeout: float = 30
) -> None:
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        seen = _state(machine, token, task_id)
        if seen == state:
            return
        time.sleep(0.1)
    raise AssertionError(f"task {task_id} is {seen}, not {state}, after {timeout:g} s")


def test_max_running_tasks_queues_the_rest_and_starts_them_in_order(
    machine: Machine, token: str
) -> None:
    before = json.loads(boxctl(machine, "settings", "--json").stdout)
    _settings(machine, maxRunningTasks=2)
    started: list[str] = []
    try:
        tasks = [start_fake(machine, token, "sleep 120", title=f"in line {n}") for n in range(4)]
        started = [t["id"] for t in tasks]
        assert [t["state"] for t in tasks] == ["running", "running", "queued", "queued"]
        one, two, three, four = started
        units = [f"box-task-{t}.service" for t in started]
        assert machine.run("systemctl", "is-active", units[2], check=False).stdout.strip() != (
            "active"
        )

        boxctl(machine, "stop", one)
        _until_state(machine, token, three, "running")
        assert _state(machine, token, four) == "queued"
        # A task that comes now waits behind the one already waiting.
        five = start_fake(machine, token, "sleep 120", title="in line 4")["id"]
        started.append(five)
        assert _state(machine, token, five) == "queued"

        # The line survives a restart: the running keep their places, the queued wait on.
        machine.run("systemctl", "restart", "boxd.service")
        assert [_state(machine, token, t) for t in (two, three, four, five)] == [
            "running",
            "running",
            "queued",
            "queued",
        ]

        # A place freed while boxd is down goes, when it comes back, to the oldest in line.
        machine.run("systemctl", "stop", "boxd.service")
        machine.run("systemctl", "kill", "--signal=KILL", units[1])
        machine.run("systemctl", "start", "boxd.service")
        _until_state(machine, token, two, "failed")
        _until_state(machine, token, four, "running")
        assert _state(machine, token, five) == "queued"

        boxctl(machine, "stop", three)
        _until_state(machine, token, five, "running")
    finally:
        for task_id in started:
            boxctl(machine, "stop", task_id, check=False)
        _settings(machine, maxRunningTasks=before["maxRunningTasks"])


def test_a_queued_task_whose_cut_off_start_left_a_worker_runs(machine: Machine, token: str) -> None:
    """Found by bench.chaos (seed 40151784): a manager killed between starting a queued task's
    worker and recording it running left the unit, and the next manager's start of that task
    failed: "Unit box-task-<id>.service was already loaded"."""
    before = json.loads(boxctl(machine, "settings", "--json").stdout)
    _settings(machine, maxRunningTasks=1)
    started: list[str] = []
    try:
        blocker = start_fake(machine, token, "sleep 120", title="holds the place")
        started.append(blocker["id"])
        waiting = start_fake(machine, token, "step ran", title="waits in line")
        started.append(waiting["id"])
        assert waiting["state"] == "queued"
        # What the cut-off start left: the task's worker unit, loaded and running. A task that
        # took a spare has that spare's worker, started ahead, under that name: it goes first.
        unit = f"box-task-{waiting['id']}.service"
        machine.run("systemctl", "stop", unit)
        machine.run("systemctl", "reset-failed", unit, check=False)
        machine.run("systemd-run", f"--unit={unit}", "sleep", "600")
        machine.run("systemctl", "restart", "boxd.service")
        boxctl(machine, "stop", blocker["id"])
        ended = finish(machine, waiting["id"])
        assert ended["state"] == "done", ended.get("error")
        assert [s["text"] for s in ended["steps"]] == ["ran"]
    finally:
        for task_id in started:
            boxctl(machine, "stop", task_id, check=False)
        _settings(machine, maxRunningTasks=before["maxRunningTasks"])
