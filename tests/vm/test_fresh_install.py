"""boxd's package on a fresh Debian 13 or 12 (testbed/fresh_image.py: debootstrap's default, as an
owner has the machine before boxd): `apt install ./boxd_*.deb` fetches what debian/control's
Depends name from Debian's mirror, leaves a running box that finds the machine fit, and tells
the owner what to do next, which then works (issue 35). The suite's own image already holds
every Depends (testbed/image.py), so only this test proves that they are complete."""

import json
import time
from collections.abc import Iterator

import pytest

from testbed.box_api import BOXCTL, finish
from testbed.fresh_image import fresh_image
from testbed.machine import Machine, log, stage_deb, wait_active
from testbed.run_box import PORT, port_in_use

APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}
OWNER = "ann"
# What a fresh machine lacks that boxd runs: each must come from the mirror with the package.
# (iproute2, passwd, mount and diffutils are in debootstrap's default already.)
FETCHED = {"python3", "python3-venv", "python3-systemd", "dbus", "polkitd", "libpam-systemd"}
# What this test host cannot give a test machine, whatever boxd does (tests/vm/test_doctor.py).
HOST_LACKS = {"cgroup controllers", "Droid"}


def installed_packages(machine: Machine) -> set[str]:
    shown = machine.run("dpkg-query", "-W", "-f", "${db:Status-Status} ${Package}\n")
    return {line.split()[1] for line in shown.stdout.splitlines() if line.startswith("installed ")}


def depends(machine: Machine) -> set[str]:
    """The names of the packages boxd's Depends name (each alternative's first)."""
    field = machine.run("dpkg-query", "-W", "-f", "${Depends}", "boxd").stdout
    return {part.split("|")[0].split()[0].split(":")[0] for part in field.split(",")}


@pytest.fixture(scope="module")
def fresh() -> Iterator[Machine]:
    """A machine of a fresh image on the host's network, for apt to reach Debian's mirror with
    the image's own sources (the same mirror the suite's images are built from). It leaves the
    host's network as it is: it has no CAP_NET_ADMIN there (testbed/machine.py), and its
    ifupdown (priority important) configures no interface, its /etc/network/interfaces naming
    none. Once installed, the test boots it again on a network of its own, where boxd's tasks
    get what they need (their namespaces, IPAddressDeny=)."""
    if port_in_use():
        pytest.fail(
            f"something on this host listens on 127.0.0.1:{PORT} (perhaps `make run`), where this "
            "machine's boxd-web must listen, sharing the host's network: stop it and run again"
        )
    with Machine(image_root=fresh_image(), private_network=False) as machine:
        yield machine


def on_a_network_of_its_own(machine: Machine) -> None:
    """Boots the machine again, as it is, on a private network."""
    machine.stop(30, keep_state=True)
    machine.private_network = True
    machine.start()
    wait_active(machine, "boxd.service", 30, "booting again on a private network")


@pytest.mark.smoke
def test_apt_installs_the_package_and_its_depends_on_a_fresh_machine(fresh: Machine) -> None:
    machine = fresh
    before = installed_packages(machine)
    assert FETCHED.isdisjoint(before), "the fresh image is not fresh: it holds boxd's Depends"

    deb = stage_deb(machine)
    started = time.monotonic()
    machine.run("apt-get", "update", "-q", env=APT_ENV, timeout=300)
    # Without Recommends: what Depends name must be enough on their own.
    installed = machine.run(
        "apt-get", "install", "-y", "--no-install-recommends", deb, env=APT_ENV, timeout=600
    )
    fetched = [line for line in installed.stdout.splitlines() if line.startswith("Need to get")]
    log(f"apt-get update and install took {time.monotonic() - started:.0f} s: {fetched}")

    pulled = installed_packages(machine) - before
    assert depends(machine) - before <= pulled
    assert pulled >= FETCHED | {"boxd"}, sorted(pulled)
    # What the owner does next, then does.
    assert "usermod -aG boxd-owner NAME" in installed.stdout
    assert "boxctl open" in installed.stdout
    wait_active(machine, "boxd.service", 30, f"apt-get install {deb}")
    assert machine.run("systemctl", "is-active", "boxd-web.socket").stdout.strip() == "active"
    # What the machine did on the host's network, it did without CAP_NET_ADMIN there.
    held = machine.run("sh", "-c", "grep ^CapBnd: /proc/1/status").stdout.split()[1]
    assert not int(held, 16) & (1 << 12), f"PID 1 holds CAP_NET_ADMIN on the host's network: {held}"

    on_a_network_of_its_own(machine)
    assert machine.run("systemctl", "is-active", "boxd-web.socket").stdout.strip() == "active"
    machine.run("useradd", "-m", OWNER)
    machine.run("usermod", "-aG", "boxd-owner", OWNER)

    told = machine.run("boxctl", "doctor", "--json", user=OWNER, check=False, timeout=120)
    assert told.returncode == 0, told.stdout + told.stderr
    answer = json.loads(told.stdout)
    assert answer["tasksStart"] is True, answer
    assert {c["name"] for c in answer["checks"] if not c["ok"]} <= HOST_LACKS, answer

    started_task = machine.run(
        BOXCTL, "start", "--worker", "fake", "--json", "step hello\nsh id -un", user=OWNER
    )
    done = finish(machine, json.loads(started_task.stdout)["id"])
    assert done["state"] == "done", done
    assert [s["text"] for s in done["steps"]] == ["hello", done["user"]]
