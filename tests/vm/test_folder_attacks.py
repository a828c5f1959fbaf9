"""Personal folders against their owner's account, or anyone who can write in them: the mirror
and keep run as the account that asked, which owns the folder, and walk by directory fds, so a
folder swapped for a link mid-copy leads nowhere, a FIFO does not hang them, a sparse file stays
sparse, modes never widen and a keep that stops says what it applied.

Each race is made exact with boxd's pause points: a drop-in gives boxd.service BOXD_PAUSE_DIR,
where root makes a FIFO named for the point; the mirror or keep opens it when it gets there and
waits, and the attacker's script, which opened it to write, swaps the path, then lets it go.
"""

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.box_api import boxctl, finish, http, start_fake, unit_environment
from testbed.folders import folder, keep, tree
from testbed.machine import Machine

PAUSES = "/run/boxd-pauses"
OTHER = "other"
SECRET = "a secret of the other account"


@pytest.fixture(scope="module", autouse=True)
def pause_points(machine: Machine) -> Iterator[None]:
    machine.run("mkdir", "-p", PAUSES)
    machine.run("chmod", "0755", PAUSES)
    with unit_environment(machine, "boxd.service", "BOXD_PAUSE_DIR", PAUSES):
        machine.run("systemctl", "restart", "boxd.service")
        yield
    machine.run("systemctl", "restart", "boxd.service")


@pytest.fixture(scope="module")
def owner_token(machine: Machine, owner: str) -> str:
    """A token the owner made: personal folders must be in that account's home."""
    return boxctl(machine, "token", "create", "--name", "owner's phone", user=owner).stdout.strip()


@pytest.fixture(scope="module")
def other(machine: Machine) -> str:
    """Another account, whose home the owner cannot read."""
    if machine.run("id", OTHER, check=False).returncode != 0:
        machine.run("useradd", "-m", OTHER)
    machine.run("chmod", "0700", f"/home/{OTHER}")
    machine.run("sh", "-c", f"printf '{SECRET}' > /home/{OTHER}/secret.txt")
    machine.run("chown", f"{OTHER}:{OTHER}", f"/home/{OTHER}/secret.txt")
    return OTHER


@pytest.fixture
def small(machine: Machine, owner: str) -> Iterator[str]:
    """An 8 MB file system in the owner's home, for what would fill a disk."""
    path = f"/home/{owner}/small"
    machine.run("mkdir", "-p", path)
    machine.run("mount", "-t", "tmpfs", "-o", "size=8m,mode=0755", "tmpfs", path)
    machine.run("chown", f"{owner}:{owner}", path)
    yield path
    machine.run("umount", path)


def attack_at(machine: Machine, point: str, owner: str, script: str) -> subprocess.Popen[str]:
    """Runs `script` as the owner the moment boxd reaches `point`, holding boxd there."""
    fifo = f"{PAUSES}/{point}"
    machine.run("rm", "-f", fifo)
    machine.run("mkfifo", "-m", "0666", fifo)
    held = f'exec 3>"{fifo}"; {script}; exec 3>&-'
    return machine.spawn("sh", "-c", held, user=owner)


def attacked(machine: Machine, attack: subprocess.Popen[str], point: str) -> None:
    try:
        out, err = attack.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        attack.kill()
        raise AssertionError(f"boxd never reached {point}") from None
    machine.run("rm", "-f", f"{PAUSES}/{point}")
    assert attack.returncode == 0, (out, err)


def mirror_of(machine: Machine, workspace: str) -> str:
    return machine.run("find", f"/var/lib/box/workspaces/{workspace}").stdout


def journal_of(machine: Machine, task_id: str) -> str:
    return machine.run("journalctl", "--no-pager", "-o", "cat", f"BOX_TASK={task_id}").stdout


def test_a_folder_swapped_for_a_link_mid_mirror_is_not_followed(
    machine: Machine, owner: str, owner_token: str, other: str
) -> None:
    real = folder(machine, owner, "swapm", {"sub/ok.txt": "ok", "top.txt": "top"})
    attack = attack_at(
        machine, "mirror-sub", owner, f"cd {real} && mv sub sub.moved && ln -s /home/{other} sub"
    )
    task = start_fake(machine, owner_token, "sh ls -R; cat sub/secret.txt || true", folder=real)
    attacked(machine, attack, "mirror-sub")
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert SECRET not in ended["steps"][0]["text"]
    assert "secret.txt" not in mirror_of(machine, task["workspace"])
    assert "top.txt" in mirror_of(machine, task["workspace"])


def test_a_fifo_swapped_in_mid_mirror_does_not_hang_it(
    machine: Machine, owner: str, owner_token: str
) -> None:
    real = folder(machine, owner, "fifo", {"a.txt": "a", "b.txt": "b"})
    attack = attack_at(machine, "mirror-a.txt", owner, f"cd {real} && rm a.txt && mkfifo a.txt")
    task = start_fake(machine, owner_token, "sh ls", folder=real)
    attacked(machine, attack, "mirror-a.txt")
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert ended["steps"][0]["text"] == "b.txt"


def test_a_file_the_owner_cannot_read_stays_out_of_the_mirror(
    machine: Machine, owner: str, owner_token: str, other: str
) -> None:
    real = folder(machine, owner, "mixed", {"mine.txt": "mine"})
    machine.run("cp", f"/home/{other}/secret.txt", f"{real}/theirs.txt")
    machine.run("chown", f"{other}:{other}", f"{real}/theirs.txt")
    machine.run("chmod", "0600", f"{real}/theirs.txt")
    task = start_fake(machine, owner_token, "sh ls; cat theirs.txt 2>&1 || true", folder=real)
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert ended["steps"][0]["text"].startswith("mine.txt")
    assert SECRET not in ended["steps"][0]["text"]


def test_a_folder_the_owner_cannot_read_is_refused(
    machine: Machine, owner: str, owner_token: str
) -> None:
    machine.run("mkdir", "-p", "/srv/closed")
    machine.run("chown", f"{owner}:{owner}", "/srv/closed")
    machine.run("chmod", "0000", "/srv/closed")
    boxctl(machine, "settings", "set", "agentFolders", '["/srv"]')
    try:
        body = {"title": "t", "prompt": "sh ls", "worker": "fake", "folder": "/srv/closed"}
        status, answer = http(machine, "POST", "/api/tasks", owner_token, json.dumps(body))
    finally:
        boxctl(machine, "settings", "set", "agentFolders", "[]")
    assert (status, answer) == (
        400,
        {
            "error": f"folder /srv/closed: your account ({owner}) cannot read it itself "
            "(permission denied); agents may not either"
        },
    )


def test_a_folder_swapped_for_a_link_mid_keep_writes_nothing_outside(
    machine: Machine, owner: str, owner_token: str
) -> None:
    real = folder(machine, owner, "swapk", {"sub/a.txt": "a"})
    outside = f"/home/{owner}/outside"
    machine.run("rm", "-rf", outside)
    machine.run("mkdir", outside)
    machine.run("chown", f"{owner}:{owner}", outside)
    task = start_fake(machine, owner_token, "write sub/a.txt written", folder=real)
    assert finish(machine, task["id"])["review"] == "pending"
    attack = attack_at(
        machine, "keep-sub%a.txt", owner, f"cd {real} && mv sub sub.moved && ln -s {outside} sub"
    )
    status, answer = keep(machine, owner_token, task["id"])
    attacked(machine, attack, "keep-sub%a.txt")
    assert status == 500, answer
    assert answer["error"].startswith(
        "Keeping stopped at sub/a.txt: a folder on its way is a link or a file now, so it was "
        "not followed. Applied (in your folders now): sub. Not applied: sub/a.txt."
    )
    assert machine.run("ls", "-A", outside).stdout == ""
    assert tree(machine, f"{real}/sub.moved") == {"a.txt": "a"}


def test_a_sparse_2_tb_file_does_not_fill_the_disk_on_keep(
    machine: Machine, owner: str, owner_token: str, small: str
) -> None:
    real = folder(machine, owner, "small/sparse", {"note.txt": "n"})
    task = start_fake(machine, owner_token, "sh truncate -s 2T big.img && echo made", folder=real)
    assert finish(machine, task["id"])["state"] == "done"
    free = machine.run("df", "--output=avail", "-B1", small).stdout.split()[-1]
    status, kept = keep(machine, owner_token, task["id"])
    assert status == 200, kept
    assert kept["review"] == "kept"
    size, blocks = machine.run("stat", "-c", "%s %b", f"{real}/big.img").stdout.split()
    assert int(size) == 2 << 40 and int(blocks) < 64
    after = machine.run("df", "--output=avail", "-B1", small).stdout.split()[-1]
    assert int(free) - int(after) < 1 << 20


def test_keep_never_widens_a_mode(machine: Machine, owner: str, owner_token: str) -> None:
    real = folder(machine, owner, "modes", {"a.txt": "a", "b.txt": "b", "c.txt": "c"})
    machine.run("chmod", "0644", f"{real}/a.txt", f"{real}/b.txt")
    machine.run("chmod", "0600", f"{real}/c.txt")
    task = start_fake(
        machine,
        owner_token,
        # The task's own copies of b.txt and c.txt, so it may chmod them (setuid bits it may not
        # set at all: RestrictSUIDSGID).
        "write a.txt changed\nsh for f in b.txt c.txt; do cp $f x && mv x $f && chmod 0777 $f; "
        "done; printf n > new.sh && chmod 0777 new.sh",
        folder=real,
    )
    assert finish(machine, task["id"])["state"] == "done"
    status, kept = keep(machine, owner_token, task["id"])
    assert status == 200, kept
    names = ["a.txt", "b.txt", "c.txt", "new.sh"]
    modes = machine.run("stat", "-c", "%a %U", *[f"{real}/{n}" for n in names]).stdout
    assert dict(zip(names, modes.splitlines(), strict=True)) == {
        "a.txt": f"644 {owner}",
        "b.txt": f"644 {owner}",
        "c.txt": f"600 {owner}",
        "new.sh": f"755 {owner}",
    }


def test_a_keep_that_stops_half_way_says_what_it_applied(
    machine: Machine, owner: str, owner_token: str, small: str
) -> None:
    real = folder(machine, owner, "small/half", {"a.txt": "a"})
    task = start_fake(
        machine,
        owner_token,
        "write a.txt changed\nsh head -c 12000000 /dev/zero > zz.bin && echo made",
        folder=real,
    )
    assert finish(machine, task["id"])["state"] == "done"
    status, answer = keep(machine, owner_token, task["id"])
    said = (
        "Keeping stopped at zz.bin: no space left on device. Applied (in your folders now): "
        "a.txt. Not applied: zz.bin. Fix what stopped it and keep again (what was applied "
        "counts as no conflict), or undo the task (what was applied stays)."
    )
    assert (status, answer) == (500, {"error": said})
    assert machine.run("ls", "-A", real).stdout.split() == ["a.txt"]
    assert tree(machine, real) == {"a.txt": "changed"}
    shown: dict[str, Any] = json.loads(boxctl(machine, "show", task["id"], "--json").stdout)
    assert (shown["review"], shown["error"]) == ("pending", said)
    assert re.search(f"is done \\({re.escape(said)}\\)", journal_of(machine, task["id"]))
    # With room made, keeping again applies the rest; what was applied is no conflict.
    machine.run("mount", "-o", "remount,size=32m", small)
    status, kept = keep(machine, owner_token, task["id"])
    assert status == 200, kept
    assert kept["review"] == "kept" and "error" not in kept
    assert machine.run("stat", "-c", "%s", f"{real}/zz.bin").stdout.strip() == "12000000"
