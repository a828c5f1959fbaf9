"""A task that fills the box's disk fails in plain words; boxd and the other tasks go on."""

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.vm.box_api import boxctl, finish, http, start_fake, wait_for_step
from tests.vm.machine import BOX_HOME, Machine, install_boxd

DISK_MIB = 128
STEPS_WHILE_FULL = 250


@pytest.fixture
def small_disk() -> Iterator[Machine]:
    """A machine whose BOX_HOME is a small ext4 of its own: an image file loop-mounted on the
    host (a loop device cannot be made inside the machine) and bound over /var/lib/box."""
    place = Path(tempfile.mkdtemp(prefix="boxd-small-disk-", dir="/var/tmp"))
    image, mount = place / "disk.img", place / "home"
    mount.mkdir()
    subprocess.run(["truncate", "-s", f"{DISK_MIB}M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    mount.chmod(0o755)
    machine = Machine(binds=[(mount, BOX_HOME, False)])
    try:
        machine.start()
        install_boxd(machine)
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
    assert stopped["error"].startswith(
        "The box's disk is full, and this task's changes took the most of it ("
    ), stopped["error"]
    assert stopped["error"].endswith(
        "MiB): boxd stopped it and threw them away to free the space. Start it again once the "
        "box has room for what it writes."
    ), stopped["error"]
    status, listed = http(machine, "GET", "/api/tasks", token)
    assert status == 200, listed
    assert {other["id"], hog["id"]} <= {t["id"] for t in listed}
    assert _available(machine) > (DISK_MIB // 2) * 2**20

    # A task that gives up by itself on the full disk says why in the box's words, not dd's.
    quitter = start_fake(machine, token, "sh dd if=/dev/zero of=big bs=1M; exit 1")
    ended = finish(machine, quitter["id"])
    assert ended["state"] == "failed", ended
    assert ended["error"].startswith("The box's disk is full"), ended["error"]
    # Its layer is gone, and with it the space it took; boxd keeps its reserve again.
    assert _available(machine) > (DISK_MIB // 2) * 2**20
    assert _has_reserve(machine)
    after = start_fake(machine, token, "write ok.txt fine")
    assert finish(machine, after["id"])["state"] == "done"
    restarts = machine.run("systemctl", "show", "-P", "NRestarts", "boxd.service").stdout
    assert restarts.strip() == "0"
