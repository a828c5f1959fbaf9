"""The owner's mounted view of each workspace, /run/boxd/views/<name>: the base with every done
layer over it, read-only, for the owner's account (group boxd-owner) and no one else, remade
when the stack changes, made again after a restart and a reboot, never mounted onto a base nor
seen by a task (boxd/manager/workspaces/owner_views.py)."""

import json
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.box_api import boxctl, finish, http, start_fake, wait_for_step
from testbed.machine import Machine, booted_box

VIEWS = "/run/boxd/views"
OWNER = "viewer"
STRANGER = "stranger"
BASES = "/var/lib/box/workspaces"
BACK_SECONDS = 120


@pytest.fixture(scope="module")
def box() -> Iterator[Machine]:
    """A machine of its own: the last test reboots it."""
    for machine in booted_box():
        machine.run("useradd", "-m", "-G", "boxd-owner", OWNER)
        machine.run("useradd", "-m", STRANGER)
        yield machine


def _token(machine: Machine) -> str:
    machine.run(
        "timeout",
        str(BACK_SECONDS),
        "sh",
        "-c",
        "until systemctl is-active -q boxd.service; do sleep 0.05; done",
        timeout=BACK_SECONDS + 10,
    )
    return machine.run("boxctl", "token", "create").stdout.strip()


def _done(machine: Machine, token: str, workspace: str, prompt: str) -> dict[str, Any]:
    ended = finish(machine, start_fake(machine, token, prompt, workspace=workspace)["id"])
    assert ended["state"] == "done", ended
    return ended


def _as(machine: Machine, user: str, script: str) -> tuple[int, str]:
    done = machine.run("sh", "-c", script, user=user, check=False)
    return done.returncode, done.stdout + done.stderr


def _mounted_on_bases(machine: Machine) -> str:
    return machine.run(
        "sh", "-c", f"findmnt -rn -o TARGET | grep -F '{BASES}' || true"
    ).stdout.strip()


def test_the_owner_reads_done_work_and_no_one_else_does(box: Machine) -> None:
    token = _token(box)
    status, _ = http(box, "POST", "/api/workspaces", token, json.dumps({"name": "seen"}))
    assert status == 201
    # An empty workspace has its view too.
    assert _as(box, OWNER, f"ls -A {VIEWS}/seen") == (0, "")
    _done(
        box,
        token,
        "seen",
        "write a.txt first\n"
        "sh mkdir -p deep && echo hidden > deep/s.txt && chmod 600 deep/s.txt && chmod 700 deep"
        " && ln -s /etc/shadow shadow-link && mkfifo pipe",
    )
    # The owner's account reads what the task left, its 0700 folder and 0600 file too.
    assert _as(box, OWNER, f"cat {VIEWS}/seen/a.txt {VIEWS}/seen/deep/s.txt") == (
        0,
        "firsthidden\n",
    )
    # A link the task left is followed with the owner's own rights, which do not reach
    # /etc/shadow; the FIFO is shown as one, and got no ACL entry.
    code, said = _as(box, OWNER, f"cat {VIEWS}/seen/shadow-link")
    assert code != 0 and "Permission denied" in said
    assert box.run("stat", "-c", "%F", f"{VIEWS}/seen/pipe").stdout.strip() == "fifo"
    acls = box.run(
        "/usr/lib/boxd/venv/bin/python",
        "-c",
        "import os, sys; print(*(os.listxattr(p, follow_symlinks=False) for p in sys.argv[1:]))",
        f"{VIEWS}/seen/pipe",
        f"{VIEWS}/seen/deep/s.txt",
    ).stdout
    assert acls.strip() == "[] ['system.posix_acl_access']"
    # GNU tar, as the owner, reads all of it: every folder and file is open to boxd-owner.
    code, said = _as(
        box, OWNER, f"tar -C {VIEWS}/seen -cf ~/seen.tar . && tar -tf ~/seen.tar | sort"
    )
    assert code == 0 and said.split() == [
        "./",
        "./a.txt",
        "./deep/",
        "./deep/s.txt",
        "./pipe",
        "./shadow-link",
    ], said
    # Another user on the machine is kept out at the gate.
    code, said = _as(box, STRANGER, f"ls {VIEWS}/seen/")
    assert code != 0 and "Permission denied" in said
    code, said = _as(box, STRANGER, f"cat {VIEWS}/seen/a.txt")
    assert code != 0 and "Permission denied" in said
    # Read-only, even for root.
    code, said = _as(box, "root", f"touch {VIEWS}/seen/mine.txt")
    assert code != 0 and "Read-only file system" in said
    # Nothing is mounted on the bases, and the views' tmpfs propagates nowhere.
    assert _mounted_on_bases(box) == ""
    assert box.run("findmnt", "-n", "-o", "PROPAGATION", VIEWS).stdout.strip() == "private"

    # A task sees no view: not the path, not a mount in its namespace; and the owner's read
    # access gives it nothing: the earlier task's 0600 file stays closed to it.
    looked = _done(
        box,
        token,
        "seen",
        f"sh ls -A /run; test -e {VIEWS} && echo VIEWS-THERE; "
        "grep -c boxd/views /proc/self/mountinfo; cat deep/s.txt 2>&1 | head -c 80 || true",
    )
    *listing, count, read = str(looked["steps"][0]["text"]).splitlines()
    assert "VIEWS-THERE" not in listing and "boxd" not in listing, listing
    assert count == "0"
    assert "Permission denied" in read


def test_undo_remakes_the_view_and_an_open_file_still_reads(box: Machine) -> None:
    token = _token(box)
    status, _ = http(box, "POST", "/api/workspaces", token, json.dumps({"name": "redo"}))
    assert status == 201
    first = _done(box, token, "redo", "write a.txt first")
    # A task running as views are remade: nothing of them reaches its namespace.
    sleeper = start_fake(box, token, "write wip.txt x\nsleep 120", workspace="redo")
    wait_for_step(box, sleeper["id"])
    _done(box, token, "redo", "write b.txt second")
    before = box.run("readlink", f"{VIEWS}/redo").stdout.strip()
    # The owner holds a.txt open, then waits on a FIFO the test writes to after the undo.
    box.run("sh", "-c", "rm -f /tmp/go /tmp/opened /tmp/held.out; mkfifo -m 666 /tmp/go")
    box.run(
        "sh",
        "-c",
        f"runuser -u {OWNER} -- sh -c 'exec 3<{VIEWS}/redo/a.txt; : >/tmp/opened; "
        "read x </tmp/go; cat <&3 >/tmp/held.out' >/dev/null 2>&1 &",
    )
    box.run("sh", "-c", "until [ -e /tmp/opened ]; do sleep 0.05; done", timeout=30)
    undone = json.loads(boxctl(box, "undo", str(first["id"]), "--json").stdout)
    assert undone["state"] == "undone"
    after = box.run("readlink", f"{VIEWS}/redo").stdout.strip()
    assert after != before
    assert _as(box, OWNER, f"ls {VIEWS}/redo") == (0, "b.txt\n")
    pid = box.run(
        "systemctl", "show", "-P", "MainPID", f"box-task-{sleeper['id']}.service"
    ).stdout.strip()
    assert pid != "0"
    seen = box.run("grep", "-c", "boxd/views", f"/proc/{pid}/mountinfo", check=False)
    assert seen.stdout.strip() == "0"
    boxctl(box, "stop", sleeper["id"])
    box.run("sh", "-c", "echo go > /tmp/go")
    box.run("sh", "-c", "until [ -s /tmp/held.out ]; do sleep 0.05; done", timeout=30)
    assert box.run("cat", "/tmp/held.out").stdout == "first"
    # The old generation is detached and gone: one generation a view.
    links = box.run("sh", "-c", f"find {VIEWS} -maxdepth 1 -type l | wc -l").stdout.strip()
    generations = box.run("sh", "-c", f"ls -A {VIEWS}/.gen | wc -l").stdout.strip()
    assert links == generations
    assert _mounted_on_bases(box) == ""


def test_a_removed_workspace_loses_its_view(box: Machine) -> None:
    token = _token(box)
    http(box, "POST", "/api/workspaces", token, json.dumps({"name": "gone"}))
    assert box.run("test", "-L", f"{VIEWS}/gone", check=False).returncode == 0
    boxctl(box, "workspace", "rm", "gone")
    assert box.run("test", "-e", f"{VIEWS}/gone", check=False).returncode != 0


def test_restart_and_reboot_make_the_views_again(box: Machine) -> None:
    token = _token(box)
    http(box, "POST", "/api/workspaces", token, json.dumps({"name": "kept"}))
    _done(box, token, "kept", "write k.txt kept")
    box.run("systemctl", "restart", "boxd.service")
    _token(box)
    assert _as(box, OWNER, f"cat {VIEWS}/kept/k.txt") == (0, "kept")
    links = box.run("sh", "-c", f"find {VIEWS} -maxdepth 1 -type l | wc -l").stdout.strip()
    generations = box.run("sh", "-c", f"ls -A {VIEWS}/.gen | wc -l").stdout.strip()
    assert links == generations
    box.stop(keep_state=True)
    box.start()
    _token(box)
    assert _as(box, OWNER, f"cat {VIEWS}/kept/k.txt {VIEWS}/redo/b.txt") == (0, "keptsecond")
    assert box.run("findmnt", "-n", "-o", "PROPAGATION", VIEWS).stdout.strip() == "private"
    assert _mounted_on_bases(box) == ""
