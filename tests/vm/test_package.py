"""boxd's Debian package as an owner meets it (docs/install.md): lintian finds no error; apt
installs it on a fresh machine and leaves a working box; `apt remove` stops everything of boxd and
keeps the box's state and users; `apt purge` leaves nothing of boxd on the machine."""

import json
import re
import subprocess
from collections.abc import Iterator

import pytest

from testbed.box_api import busctl_call, busctl_result, finish, wait_for_step
from testbed.deb_package import built_deb
from testbed.machine import BOX_HOME, Machine, stage_deb, wait_active

APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}
# What is on the machine, each path with its type, mode and owners: the root file system, and
# BOX_HOME, which the test machine has on a file system of its own.
LISTING = r"find / /var/lib/box -xdev -printf '%y %m %u:%g %p\n'"
# Paths that change whatever is installed, none of them boxd's.
NOT_BOXD_S = (
    # dpkg's and apt's record of what they did, and their logs; the journal.
    "/var/lib/dpkg/",
    "/var/lib/apt/",
    "/var/cache/apt/",
    "/var/cache/debconf/",
    "/var/log/",
    # The copies of the account files that useradd and userdel keep of the version before.
    "/etc/passwd-",
    "/etc/group-",
    "/etc/shadow-",
    "/etc/gshadow-",
    # systemd's key for the credentials of any service, made the first time one is encrypted.
    "/var/lib/systemd/credential.secret",
)
# What the package puts where docs/install.md says.
PLACED = {
    "/usr/lib/systemd/system/boxd.service",
    "/usr/lib/systemd/system/boxd-web.socket",
    "/usr/lib/systemd/system/box-broker@.service",
    "/usr/lib/sysusers.d/boxd.conf",
    "/usr/lib/tmpfiles.d/boxd.conf",
    "/usr/share/dbus-1/system.d/org.boxd.Box1.conf",
    "/usr/share/polkit-1/actions/org.boxd.Box1.policy",
    "/usr/share/polkit-1/rules.d/50-boxd.rules",
    "/usr/bin/boxctl",
    "/usr/sbin/boxd",
    "/usr/share/man/man1/boxctl.1.gz",
    "/usr/share/man/man8/boxd.8.gz",
    "/usr/share/doc/boxd/README.md",
    "/usr/share/doc/boxd/docs/architecture.md",
    "/usr/lib/boxd/python.env",
    "/usr/lib/boxd/python/boxd/main.py",
    "/usr/lib/boxd/python3.11",
    "/usr/lib/boxd/python3.13",
}


# The /var/tmp of a service of the machine's with PrivateTmp=, made as it starts: polkitd is
# started by D-Bus when first asked (on Debian 13 it has one), at boot by whatever asks first,
# before the listing of before or after it. Those of boxd's units (box-*, boxd-*) count.
OTHERS_PRIVATE_TMP = re.compile(r"/var/tmp/systemd-private-[0-9a-f]{32}-(?!box)")


def listing(machine: Machine) -> set[str]:
    lines = machine.run("sh", "-c", LISTING, timeout=300).stdout.splitlines()
    return {
        line
        for line in lines
        if not line.split(" ", 3)[3].startswith(NOT_BOXD_S)
        and not OTHERS_PRIVATE_TMP.match(line.split(" ", 3)[3])
    }


# What a task's links point at (test_install_remove_and_purge).
OUTSIDE = "/srv/outside"
B = f"{OUTSIDE}/dir/b"
PLANT = (
    f"ln -s /etc to-etc && ln -s / to-root && ln -s {OUTSIDE}/dir to-dir && ln -s {B} to-b && "
    f"mkdir -p deep/er && ln -s {OUTSIDE} deep/er/to-outside && ln -s /etc/passwd deep/passwd && "
    "echo planted"
)


def sums(machine: Machine) -> str:
    """The content of the files outside BOX_HOME a task's links point at (of /etc, which
    installing and purging change, the listing has each file's name, type, mode and owner)."""
    return machine.run(
        "sh", "-c", f"find {OUTSIDE} -type f -print0 | sort -z | xargs -0 sha256sum"
    ).stdout


def accounts(machine: Machine) -> tuple[list[str], list[str]]:
    return (
        sorted(machine.run("getent", "passwd").stdout.splitlines()),
        sorted(machine.run("getent", "group").stdout.splitlines()),
    )


def boxd_s_units(machine: Machine) -> list[str]:
    """boxd's units that run, or fail, or are on their way: its own, and every task's."""
    shown = machine.run(
        "systemctl",
        "list-units",
        "--all",
        "--plain",
        "--no-legend",
        "--state=active,activating,deactivating,reloading,failed",
        "box*",
    )
    return [line.split()[0] for line in shown.stdout.splitlines() if line.strip()]


def mounts_of_boxd(machine: Machine) -> list[str]:
    points = machine.run("findmnt", "-rno", "TARGET").stdout.split()
    return [p for p in points if p.startswith((f"{BOX_HOME}/", "/run/boxd"))]


def start(machine: Machine, title: str, prompt: str) -> dict[str, str]:
    request = {"title": title, "prompt": prompt, "worker": "fake"}
    task: dict[str, str] = busctl_result(busctl_call(machine, "CreateTask", json.dumps(request)))
    return task


@pytest.fixture(scope="module")
def fresh() -> Iterator[Machine]:
    """A machine boxd was never installed on."""
    with Machine() as machine:
        yield machine


def test_lintian_finds_no_error_in_the_package() -> None:
    done = subprocess.run(["lintian", str(built_deb())], capture_output=True, text=True)
    assert [line for line in done.stdout.splitlines() if line.startswith("E:")] == []


@pytest.mark.smoke
def test_install_remove_and_purge(fresh: Machine) -> None:
    machine = fresh
    # Files outside BOX_HOME a task's links will point at: purge must follow none of them.
    machine.run("sh", "-c", f"mkdir -p {OUTSIDE}/dir && echo a > {OUTSIDE}/a && echo b > {B}")
    files_before, accounts_before = listing(machine), accounts(machine)
    outside_before = sums(machine)

    deb = stage_deb(machine)
    installed = machine.run("apt-get", "install", "-y", deb, env=APT_ENV, timeout=300)
    # What the owner does next.
    assert "usermod -aG boxd-owner NAME" in installed.stdout
    assert "boxctl open" in installed.stdout
    wait_active(machine, "boxd.service", 20, f"apt-get install {deb}")
    for unit in ("boxd.service", "boxd-web.socket"):
        assert machine.run("systemctl", "is-enabled", unit).stdout.strip() == "enabled"
    assert machine.run("systemctl", "is-active", "boxd-web.socket").stdout.strip() == "active"
    placed = set(machine.run("dpkg", "-L", "boxd").stdout.splitlines())
    assert placed >= PLACED
    assert machine.run("sh", "-c", "command -v boxctl").stdout.strip() == "/usr/bin/boxctl"
    assert "usage: boxctl" in machine.run("boxctl", "--help").stdout
    done = finish(machine, start(machine, "packaged", "step hello\nsh id -un")["id"])
    assert done["state"] == "done", done
    assert [s["text"] for s in done["steps"]] == ["hello", done["user"]]
    # The attacker: a task plants links in its part of BOX_HOME, to /etc, to /, to a folder and
    # a file of another's; and deep in a tree of its own, which purge goes through.
    planted = finish(machine, start(machine, "planter", f"sh {PLANT}")["id"])
    assert [s["text"] for s in planted["steps"]] == ["planted"], planted
    links = machine.run("find", BOX_HOME, "-type", "l", "-printf", "%l\n").stdout.split()
    assert {"/etc", "/", f"{OUTSIDE}/dir", B, OUTSIDE, "/etc/passwd"} <= set(links)

    # Removed while a task runs.
    running = start(machine, "running", "step started\nsleep 600")
    wait_for_step(machine, running["id"])
    assert boxd_s_units(machine) != [] and mounts_of_boxd(machine) != []
    # And what a check of the machine cut off leaves, named for a process that never ends, so
    # boxd's own next check leaves them (boxd.manager.doctor.leftovers): its probe unit, which
    # remains after its exit, and its network namespace.
    left = "1-0badc0de"
    machine.run(
        "systemd-run", f"--unit=boxd-doctor-bpf-{left}", "-p", "RemainAfterExit=yes", "true"
    )
    machine.run("ip", "netns", "add", f"boxd-doctor-{left}")
    machine.run("apt-get", "remove", "-y", "boxd", env=APT_ENV, timeout=300)
    assert boxd_s_units(machine) == []
    assert machine.run("pgrep", "-u", running["user"], check=False).stdout == ""
    assert machine.run("pgrep", "-f", "/usr/lib/boxd/", check=False).stdout == ""
    assert mounts_of_boxd(machine) == []
    assert machine.run("ls", "/run/netns", check=False).stdout.split() == []
    # The box's state and its users stay for the next install.
    for kept in ("box.db", "vault/box", "workspaces"):
        machine.run("test", "-e", f"{BOX_HOME}/{kept}")
    for user in (running["user"], done["user"], "boxd-broker", "boxd-web"):
        machine.run("getent", "passwd", user)
    assert machine.run("test", "-e", "/usr/bin/boxctl", check=False).returncode != 0

    machine.run("apt-get", "purge", "-y", "boxd", env=APT_ENV, timeout=300)
    assert accounts(machine) == accounts_before
    files_after = listing(machine)
    assert sorted(files_after - files_before) == []
    assert sorted(files_before - files_after) == []
    # Nothing the links pointed at was removed or changed (the listing above has /etc's names).
    assert sums(machine) == outside_before
