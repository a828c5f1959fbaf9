"""The box's disk fills: a task that fills it fails in plain words and boxd and the others go
on; a disk filled by something else (the owner's files) refuses steps, calls and new tasks in
plain words, loses nothing acknowledged across boxd's crashes and restarts, and the box goes on
by itself once space is freed."""

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from boxd.errors import NO_ROOM_TO_START
from boxd.manager.box import STOPPED, stop_waits_for_room
from boxd.manager.record.group_commit import RECORD_FULL
from testbed.box_api import boxctl, finish, http, start_fake, wait_for_step
from testbed.machine import BOX_HOME, Machine, install_boxd
from testbed.npm_registry import wait_for_droid

DISK_MIB = 128
STEPS_WHILE_FULL = 250


@pytest.fixture
def small_disk() -> Iterator[Machine]:
    yield from _small_disk()


@pytest.fixture
def bare_disk() -> Iterator[Machine]:
    """As small_disk, with no blocks reserved for root: a task's own user can fill it all."""
    yield from _small_disk("-m", "0")


def _small_disk(*mkfs: str) -> Iterator[Machine]:
    """A machine whose BOX_HOME is a small ext4 of its own: an image file loop-mounted on the
    host (a loop device cannot be made inside the machine) and bound over /var/lib/box."""
    place = Path(tempfile.mkdtemp(prefix="boxd-small-disk-", dir="/var/tmp"))
    image, mount = place / "disk.img", place / "home"
    mount.mkdir()
    subprocess.run(["truncate", "-s", f"{DISK_MIB}M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", *mkfs, str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    mount.chmod(0o755)
    machine = Machine(binds=[(mount, BOX_HOME, False)])
    try:
        machine.start()
        install_boxd(machine)
        # boxd records its Droid install's end (here a failure: the machine reaches no
        # registry) as it starts: a write at the moment a test fills the disk would meet the
        # full disk before the test does, and set off the box's response first.
        wait_for_droid(machine)
        yield machine
    finally:
        machine.stop()
        subprocess.run(["umount", str(mount)], check=False)
        shutil.rmtree(place, ignore_errors=True)


def _available(machine: Machine) -> int:
    blocks, size = machine.run("stat", "-f", "-c", "%a %S", BOX_HOME).stdout.split()
    return int(blocks) * int(size)


def _has_reserve(machine: Machine) -> bool:
    found = machine.run("test", "-e", f"{BOX_HOME}/box.db-reserve", check=False)
    return found.returncode == 0


def test_a_task_that_fills_the_disk_fails_and_the_box_goes_on(small_disk: Machine) -> None:
    machine = small_disk
    size = machine.run("df", "--output=size", "-B1M", BOX_HOME).stdout.split()[-1]
    assert int(size) < DISK_MIB, "BOX_HOME is not the small disk"
    token = boxctl(machine, "token", "create").stdout.strip()

    # Another task waits until the disk is full, then logs a megabyte of steps: boxd must
    # record them, though its database can only grow into the space it kept in reserve.
    big_steps = "sh head -c 3000 /dev/urandom | base64 -w0\n" * STEPS_WHILE_FULL
    other = start_fake(
        machine,
        token,
        "step before\n"
        "sh until [ $(stat -f -c %a .) -eq 0 ]; do sleep 0.1; done; echo the disk is full\n"
        f"{big_steps}step after",
    )
    wait_for_step(machine, other["id"])
    # It writes until the disk is full (through its overlay, root's reserved blocks too), and
    # then holds on to the space, as an agent that retries for ever would.
    hog = start_fake(machine, token, "step filling\nsh dd if=/dev/zero of=big bs=1M; sleep 600")
    done = finish(machine, other["id"])
    assert done["state"] == "done", done
    texts = [s["text"] for s in done["steps"]]
    assert texts[:2] == ["before", "the disk is full"]
    assert len(texts) == 3 + STEPS_WHILE_FULL and texts[-1] == "after"
    assert all(len(text) == 4000 for text in texts[2:-1])
    gave_up = machine.run("journalctl", "-u", "boxd.service", "--grep", "gave up the space")
    assert "The box's disk is full" in gave_up.stdout
    # boxd stopped the task whose changes took the disk, in plain words, and its space is back.
    stopped = finish(machine, hog["id"])
    assert stopped["state"] == "failed", stopped
    _assert_stopped_by_the_box(stopped)
    status, listed = http(machine, "GET", "/api/tasks", token)
    assert status == 200, listed
    assert {other["id"], hog["id"]} <= {t["id"] for t in listed}
    assert _available(machine) > (DISK_MIB // 2) * 2**20

    # A task that gives up by itself on the full disk says why in the box's words, not dd's.
    quitter = start_fake(machine, token, "sh dd if=/dev/zero of=big bs=1M; exit 1")
    ended = finish(machine, quitter["id"], timeout=30)
    assert ended["state"] == "failed", ended
    assert ended["error"].startswith("The box's disk is full"), ended["error"]
    # Its layer is gone, and with it the space it took; boxd keeps its reserve again.
    assert _available(machine) > (DISK_MIB // 2) * 2**20
    assert _has_reserve(machine)
    after = start_fake(machine, token, "write ok.txt fine")
    assert finish(machine, after["id"])["state"] == "done"
    restarts = machine.run("systemctl", "show", "-P", "NRestarts", "boxd.service").stdout
    assert restarts.strip() == "0"


def _assert_stopped_by_the_box(task: dict[str, Any]) -> None:
    assert task["state"] == "failed", task
    assert task["error"].startswith(
        "The box's disk is full, and this task's files (its changes and its home) took the "
        "most of it ("
    ), task["error"]
    assert task["error"].endswith(
        "MiB): boxd stopped it and threw them away to free the space. Start it again once the "
        "box has room for what it writes."
    ), task["error"]


def _until_full(machine: Machine, timeout: float = 30) -> None:
    """Waits until no block is left for anyone (a test may poll; boxd itself never does)."""
    deadline = time.monotonic() + timeout
    while _available(machine) > 0:
        assert time.monotonic() < deadline, f"{BOX_HOME} still has room {timeout:g} s later"
        time.sleep(0.1)


def _until_full_or_ended(machine: Machine, task: dict[str, Any], timeout: float = 30) -> bool:
    """Waits until the task's own user can write nothing more (True), or the task has ended
    (False). Not until no block is left: ext4 keeps the last few dozen blocks from writers
    without CAP_SYS_RESOURCE, boxd among them, so the disk is full for the task and for boxd
    alike with those still free, and stays so unless something else writes."""
    deadline = time.monotonic() + timeout
    probe = f"{BOX_HOME}/tasks/{task['id']}/home/.probe"
    while True:
        if _state(machine, task["id"]) in ("done", "failed", "undone"):
            return False
        wrote = machine.run(
            "sh",
            "-c",
            f"dd if=/dev/zero of={probe} bs=4k count=1 conv=fsync 2>/dev/null; s=$?; "
            f"rm -f {probe}; exit $s",
            user=task["user"],
            check=False,
        )
        if wrote.returncode != 0:
            return True
        assert time.monotonic() < deadline, f"{BOX_HOME} still has room {timeout:g} s later"
        time.sleep(0.1)


def _state(machine: Machine, task_id: str) -> str:
    return str(json.loads(boxctl(machine, "show", task_id, "--json").stdout)["state"])


def _gone(machine: Machine, path: str) -> bool:
    return machine.run("test", "-e", path, check=False).returncode == 1


def test_a_task_that_fills_the_disk_through_its_home_is_stopped_by_the_box(
    bare_disk: Machine,
) -> None:
    """Its home is its own user's, outside its view: on a file system with no root reserve it
    takes every block, and goes on taking the space boxd frees to record that."""
    machine = bare_disk
    token = boxctl(machine, "token", "create").stdout.strip()
    other = start_fake(
        machine,
        token,
        "step ready\nsh until [ -e /etc/go-on ]; do sleep 0.1; done; echo going on\nstep after",
    )
    hog = start_fake(
        machine,
        token,
        "step ready\n"
        # In big writes, then small ones for the last blocks: a 64 KiB write fails whole where
        # less is left, and the rest stayed free for anyone.
        "sh n=0; while :; do n=$((n+1)); dd if=/dev/zero of=$HOME/fill-$n bs=64k 2>/dev/null;"
        " dd if=/dev/zero of=$HOME/last-$n bs=1k 2>/dev/null; sleep 0.1; done",
    )
    for task in (other, hog):
        wait_for_step(machine, task["id"])
    # Any write to the record meets the full disk: the test's own steps, or one boxd makes by
    # itself meanwhile (a spare's user claimed as the tasks took theirs), which may set off the
    # box's response before the test sees the disk full.
    if _until_full_or_ended(machine, hog):
        # Steps to log on the full disk: boxd gives up its reserve to record them, and looks
        # for the task that holds the disk.
        _post_steps(machine, other, "full", "reserve")
    stopped = finish(machine, hog["id"], timeout=60)
    _assert_stopped_by_the_box(stopped)
    assert _gone(machine, f"{BOX_HOME}/tasks/{hog['id']}/home")
    assert _available(machine) > (DISK_MIB // 2) * 2**20
    machine.run("touch", "/etc/go-on")
    done = finish(machine, other["id"])
    assert done["state"] == "done", done
    assert [s["text"] for s in done["steps"]][-2:] == ["going on", "after"]
    fresh = start_fake(machine, token, "write ok.txt fine")
    assert finish(machine, fresh["id"])["state"] == "done"
    assert _has_reserve(machine)


def test_the_owners_stop_ends_a_task_that_filled_the_disk_through_its_home(
    bare_disk: Machine,
) -> None:
    """The disk full of the owner's files but for a little, which a task's home takes, and then
    the space boxd frees to record that: the owner's stop must not wait for room that only
    clearing that task frees."""
    machine = bare_disk
    token = boxctl(machine, "token", "create").stdout.strip()
    hog = start_fake(
        machine,
        token,
        "step ready\n"
        "sh until [ -e /etc/fill ]; do sleep 0.1; done;"
        " dd if=/dev/zero of=$HOME/a bs=64k 2>/dev/null; echo filled\n"
        "sh until [ -e /etc/take-the-rest ]; do sleep 0.1; done; n=0;"
        " while :; do n=$((n+1)); dd if=/dev/zero of=$HOME/b-$n bs=4k 2>/dev/null; sleep 0.1;"
        " done",
    )
    other = start_fake(
        machine,
        token,
        "step ready\n"
        "sh until [ -e /etc/still-full ]; do sleep 0.1; done; echo the disk is still full\n"
        "step after",
    )
    for task in (hog, other):
        wait_for_step(machine, task["id"])
    # The owner's files take all but 8 MiB, which the task's home takes: less than boxd's
    # reserve, so boxd's own answer to the full disk stops no task for it.
    machine.run("sh", "-c", _FILL_BUT_8_MIB)
    machine.run("touch", "/etc/fill")
    wait_for_step(machine, hog["id"], 2)
    # Its step "filled" may have taken boxd's reserve already; these take it if not.
    _post_steps(machine, other, "reserve", "reserve")
    assert not _has_reserve(machine)
    _journal_says(machine, "boxd.service", "none is stopped")
    # The task takes the space boxd freed, and then the record has no room for anything.
    machine.run("touch", "/etc/take-the-rest")
    _until_full(machine)
    full = _post_steps(machine, other, "full", "refused")
    assert full["refused"] == [507, {"error": RECORD_FULL}], full
    machine.run("touch", "/etc/still-full")
    _journal_says(machine, f"box-task-{other['id']}.service", "Waiting for room")

    answer = http(machine, "POST", f"/api/tasks/{hog['id']}/stop", token)
    assert answer[0] == 200, answer
    assert (answer[1]["state"], answer[1]["error"]) == ("failed", STOPPED), answer
    assert _gone(machine, f"{BOX_HOME}/tasks/{hog['id']}/home")
    assert _available(machine) > 16 * 2**20
    # The other task goes on by itself, and so do new ones once the owner's files are gone.
    done = finish(machine, other["id"])
    assert done["state"] == "done", done
    assert [s["text"] for s in done["steps"]][-2:] == ["the disk is still full", "after"]
    machine.run("rm", f"{BOX_HOME}/filler")
    fresh = start_fake(machine, token, "write ok.txt fine")
    assert finish(machine, fresh["id"])["state"] == "done"
    assert _has_reserve(machine)
    shown = json.loads(boxctl(machine, "show", hog["id"], "--json").stdout)
    assert (shown["state"], shown["error"]) == ("failed", STOPPED)


_FILL_BUT_8_MIB = f"""
set -e
cd {BOX_HOME}
free=$(( $(stat -f -c %a .) * $(stat -f -c %S .) ))
fallocate -l $(( free - 8388608 )) filler
"""


def test_a_disk_quota_is_refused_where_the_file_system_keeps_none(machine: Machine) -> None:
    """The test machine's kernel is built without a quota format (CONFIG_QFMT_V2) and without
    XFS quotas, so no file system here keeps project quotas: the setting is refused, in words
    that say where it works, and stays off. (boxd asks the kernel itself: the machine lets
    quotactl_fd through its seccomp filter.)"""
    refused = boxctl(machine, "settings", "set", "taskDiskQuotaBytes", str(2**30), check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "boxctl: taskDiskQuotaBytes cannot be set on this box: the file system of "
        f"{BOX_HOME} does not enforce project quotas. It works where {BOX_HOME} is ext4 "
        "made with -O quota,project and mounted with prjquota, or XFS mounted with prjquota, "
        "on Linux 5.14 or later."
    )
    shown = json.loads(boxctl(machine, "settings", "--json").stdout)
    assert shown["taskDiskQuotaBytes"] is None


# The owner's own files fill the disk: every free block, root's reserved ones too, as root can.
_FILL = f"""
set -e
cd {BOX_HOME}
n=$(ls | grep -c '^filler-' || true)
free=$(( $(stat -f -c %f .) * $(stat -f -c %S .) ))
if [ "$free" -gt 8388608 ]; then fallocate -l $(( free - 4194304 )) filler-$n-a; fi
dd if=/dev/zero of=filler-$n-b bs=4k 2>/dev/null || true
dd if=/dev/zero of=filler-$n-c bs=1k 2>/dev/null || true
sync
"""

# Posts steps to a task's broker, as its user would, and says which got a 200: until the first
# refusal, or (`reserve`) until boxd has given up its reserve, or (`one`) one. Until a refusal,
# steps of 200 kB and then smaller ones, so no room is left for even a small write.
_POST_STEPS = f"""
import http.client, json, os, socket, sys

class Broker(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("box", timeout=60)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(self.unix_path)

path, prefix, until = sys.argv[1:4]
reserve = "{BOX_HOME}/box.db-reserve"
acked, refused = [], None
for size in (200000, 8000, 10) if until == "refused" else (200000,):
    for number in range(400):
        text = f"{{prefix}}-{{len(acked)}}"
        broker = Broker(path)
        body = json.dumps({{"text": text, "data": {{"pad": "x" * size}}}})
        broker.request("POST", "/step", body, {{"Content-Type": "application/json"}})
        answer = broker.getresponse()
        said = json.loads(answer.read())
        broker.close()
        if answer.status != 200:
            if refused not in (None, [answer.status, said]):
                sys.exit(f"refused in other words: {{refused}} then {{[answer.status, said]}}")
            refused = [answer.status, said]
            break
        acked.append(text)
        if until == "one" or (until == "reserve" and not os.path.exists(reserve)):
            break
print(json.dumps({{"acked": acked, "refused": refused}}))
"""

_STEP_TEXTS = f"""
import json, sqlite3, sys
db = sqlite3.connect("file:{BOX_HOME}/box.db?mode=ro", uri=True)
rows = db.execute(
    "SELECT data FROM events WHERE task = ? AND kind = 'task.step' ORDER BY seq", (sys.argv[1],)
).fetchall()
print(json.dumps([json.loads(data)["text"] for (data,) in rows]))
"""

_INTEGRITY = """
import sqlite3, sys
print(sqlite3.connect(sys.argv[1]).execute("PRAGMA integrity_check").fetchone()[0])
"""

PYTHON = "/usr/lib/boxd/venv/bin/python"


def _post_steps(machine: Machine, task: dict[str, Any], prefix: str, until: str) -> Any:
    socket = f"{BOX_HOME}/tasks/{task['id']}/broker.sock"
    done = machine.run(PYTHON, "-c", _POST_STEPS, socket, prefix, until, user=task["user"])
    return json.loads(done.stdout)


def _broker_call(machine: Machine, task: dict[str, Any], body: dict[str, Any]) -> Any:
    socket = f"{BOX_HOME}/tasks/{task['id']}/broker.sock"
    done = machine.run(
        "curl", "-sS", "-w", "\n%{http_code}", "--unix-socket", socket,
        "-H", "Content-Type: application/json", "--data-binary", "@-", "http://box/call",
        input=json.dumps(body), user=task["user"],
    )  # fmt: skip
    text, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(text)


def _logged(machine: Machine, task_id: str) -> list[str]:
    return list(json.loads(machine.run(PYTHON, "-c", _STEP_TEXTS, task_id).stdout))


def _bookings(machine: Machine, task_id: str) -> list[list[Any]]:
    script = (
        "import json, sqlite3, sys\n"
        f"db = sqlite3.connect('{BOX_HOME}/apps/wallet/ledger.db')\n"
        "print(json.dumps(db.execute('SELECT key, cents FROM bookings WHERE task = ?',"
        " (sys.argv[1],)).fetchall()))\n"
    )
    return list(json.loads(machine.run(PYTHON, "-c", script, task_id).stdout))


def _wait_active_again(machine: Machine, old_pid: str, timeout: float = 60) -> None:
    """Waits for a new boxd to be up (a test may poll; boxd itself never does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = machine.run("systemctl", "show", "-P", "ActiveState", "boxd.service").stdout
        if state.strip() == "active" and _main_pid(machine) not in ("0", old_pid):
            return
        time.sleep(0.2)
    said = machine.run("journalctl", "-q", "-n", "60", "-u", "boxd.service", check=False).stdout
    raise AssertionError(f"boxd is not up again {timeout:g} s later:\n{said}")


def _main_pid(machine: Machine) -> str:
    return machine.run("systemctl", "show", "-P", "MainPID", "boxd.service").stdout.strip()


def _journal_says(machine: Machine, unit: str, words: str, timeout: float = 30) -> str:
    """The first line of the unit's journal with `words` in it, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        said = machine.run("journalctl", "-q", "-u", unit, "--grep", words, check=False).stdout
        if said:
            return said.splitlines()[0]
        time.sleep(0.2)
    raise AssertionError(f"{unit} did not say {words!r} in {timeout:g} s")


def _made_things(machine: Machine) -> tuple[str, str, str]:
    """What starting a task makes: its folder, its user, its units."""
    return (
        machine.run("ls", f"{BOX_HOME}/tasks").stdout,
        machine.run("sh", "-c", "getent passwd | grep '^box-' | sort").stdout,
        machine.run("systemctl", "list-units", "--all", "--plain", "--no-legend", "box-*").stdout,
    )


def test_a_disk_filled_from_outside_refuses_in_words_loses_nothing_and_recovers(
    small_disk: Machine,
) -> None:
    machine = small_disk
    token = boxctl(machine, "token", "create").stdout.strip()
    # Steps are posted to this task's broker straight from the test, to see every answer.
    poster = start_fake(machine, token, "step ready\nsleep 600", tools=["wallet.pay"])
    # This one is the fake worker meeting the full disk: it steps and pays once the disk is full
    # (the marker is outside BOX_HOME, in /etc, which its sandbox shows it read-only).
    worker = start_fake(
        machine,
        token,
        "step before\n"
        "sh until [ -e /etc/disk-is-full ]; do sleep 0.1; done; echo the disk is full\n"
        'call wallet.pay {"to": "Ada", "cents": 5}\n'
        "step after the call",
        tools=["wallet.pay"],
    )
    # And this one gives up by itself on the full disk (after boxd's restart below, so that
    # no restart comes after it), when its end cannot be recorded.
    quitter = start_fake(
        machine,
        token,
        "step ready\nsh until [ -e /etc/disk-still-full ]; do sleep 0.1; done; exit 3",
    )
    # And this one the owner stops while the disk is full.
    stopped = start_fake(machine, token, "step ready\nsleep 600")
    for task in (poster, worker, quitter, stopped):
        wait_for_step(machine, task["id"])

    # Full, but boxd has its reserve: the record takes it rather than refuse, and no task is
    # stopped for it, since none of their changes took the space.
    machine.run("sh", "-c", _FILL)
    first = _post_steps(machine, poster, "reserve", "reserve")
    assert first["refused"] is None and not _has_reserve(machine), first
    # Full to the last block, the reserve taken too.
    machine.run("sh", "-c", _FILL)
    machine.run("touch", "/etc/disk-is-full")
    full = _post_steps(machine, poster, "full", "refused")
    assert full["refused"] == [507, {"error": RECORD_FULL}], full
    acked = ["ready", *first["acked"], *full["acked"]]
    pay = {"tool": "wallet.pay", "input": {"to": "Bo", "cents": 3}, "key": "direct-1"}
    assert _broker_call(machine, poster, pay) == (507, {"error": RECORD_FULL})
    waits = _journal_says(machine, f"box-task-{worker['id']}.service", "Waiting for room")
    assert "POST /step: The box's disk is full: boxd cannot add to its record" in waits, waits

    # No new task on a full disk, and nothing of one left behind.
    before = _made_things(machine)
    request = {"title": "too late", "prompt": "step never", "worker": "fake"}
    status, refused = http(machine, "POST", "/api/tasks", token, json.dumps(request))
    assert (status, refused) == (507, {"error": NO_ROOM_TO_START})
    assert _made_things(machine) == before
    status, listed = http(machine, "GET", "/api/tasks", token)
    assert status == 200 and len(listed) == 4, listed

    # boxd killed on the full disk: it comes back, and every step it acknowledged is there.
    pid = _main_pid(machine)
    machine.run("systemctl", "kill", "--signal=KILL", "boxd.service")
    _wait_active_again(machine, pid)
    assert _logged(machine, poster["id"]) == acked
    for task in (poster, worker, quitter, stopped):
        assert json.loads(boxctl(machine, "show", task["id"], "--json").stdout)["state"] in (
            "running",
            "waiting",
        )
    # A task that gives up now is ended, and its end waits for room to be recorded.
    still = _post_steps(machine, poster, "still", "refused")
    assert still["refused"] == [507, {"error": RECORD_FULL}], still
    acked += still["acked"]
    machine.run("touch", "/etc/disk-still-full")
    quit_id = quitter["id"]
    said = _journal_says(
        machine,
        "boxd.service",
        f"(the end of task {quit_id} waits for room|could not follow the worker of task {quit_id})",
    )
    assert "waits for room" in said, said
    # The owner's stop is answered at once, in words: the worker is stopped, its end waits.
    stop_id = stopped["id"]
    answer = http(machine, "POST", f"/api/tasks/{stop_id}/stop", token)
    assert answer == (507, {"error": stop_waits_for_room(stop_id)}), answer
    # Asked again, and to undo it, the owner is told the same at once, not kept behind the end.
    again = http(machine, "POST", f"/api/tasks/{stop_id}/stop", token)
    assert again == answer, again
    undo = http(machine, "POST", f"/api/tasks/{stop_id}/undo", token)
    assert undo == answer, undo
    unit = machine.run("systemctl", "is-active", f"box-task-{stop_id}.service", check=False)
    assert unit.stdout.strip() in ("inactive", "unknown"), unit.stdout
    assert json.loads(boxctl(machine, "show", stop_id, "--json").stdout)["state"] == "running"

    # Space freed: with no restart, the waiting worker goes on and its task ends done, the call
    # refused before now books (once), steps go through, and boxd keeps its reserve again.
    machine.run("sh", "-c", f"rm -f {BOX_HOME}/filler-*")
    done = finish(machine, worker["id"])
    assert done["state"] == "done", done
    texts = [s["text"] for s in done["steps"]]
    assert texts[:2] == ["before", "the disk is full"] and texts[3] == "after the call", texts
    assert texts[2].startswith('wallet.pay: {"booking": "line-3"'), texts
    assert _bookings(machine, worker["id"]) == [["line-3", 5]]
    assert _has_reserve(machine)
    status, paid = _broker_call(machine, poster, pay)
    assert status == 200 and paid["ok"] is True, paid
    assert _bookings(machine, poster["id"]) == [["direct-1", 3]]
    after = _post_steps(machine, poster, "after", "one")
    assert after == {"acked": ["after-0"], "refused": None}, after
    acked += after["acked"]
    halted = finish(machine, stop_id, timeout=30)
    assert (halted["state"], halted["error"]) == ("failed", STOPPED), halted
    ended = finish(machine, quitter["id"], timeout=30)
    assert ended["state"] == "failed", ended
    assert ended["error"].startswith("The box's disk is full: the task could not write"), ended
    fresh = start_fake(machine, token, "write ok.txt fine")
    assert finish(machine, fresh["id"])["state"] == "done"

    # And after a restart the record still has it all, undamaged, and so does the ledger.
    pid = _main_pid(machine)
    machine.run("systemctl", "restart", "boxd.service")
    _wait_active_again(machine, pid)
    assert _logged(machine, poster["id"])[: len(acked)] == acked
    for database in (f"{BOX_HOME}/box.db", f"{BOX_HOME}/apps/wallet/ledger.db"):
        assert machine.run(PYTHON, "-c", _INTEGRITY, database).stdout.strip() == "ok"
