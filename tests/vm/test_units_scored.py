"""boxd's own units keep the sandbox docs/sandbox.md scores them at: `systemd-analyze security` for
the manager, a task's broker and the gateway at or under their figures, and the settings each
figure rests on, as systemd holds them."""

import re

import pytest

from testbed.box_api import finish, http, start_fake, wait_for_step
from testbed.machine import Machine

# The figures in docs/sandbox.md, "boxd's own units".
CEILINGS = {
    "boxd.service": 4.4,
    "box-broker@": 1.1,
    "box-app@": 1.1,
    "boxd-web.service": 0.2,
    "boxd-droid-install.service": 1.4,
    "boxd-claude-install.service": 1.4,
}


def exposure(machine: Machine, unit: str) -> float:
    report = machine.run("systemd-analyze", "security", "--no-pager", unit, check=False).stdout
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", report)
    assert found is not None, report
    return float(found.group(1))


def shown(machine: Machine, unit: str, *names: str) -> dict[str, str]:
    text = machine.run("systemctl", "show", unit, *(f"--property={name}" for name in names)).stdout
    return {name: value for name, _, value in (ln.partition("=") for ln in text.splitlines())}


@pytest.mark.parametrize(
    "unit",
    [
        "boxd.service",
        "boxd-web.service",
        "boxd-droid-install.service",
        "boxd-claude-install.service",
    ],
)
def test_the_manager_and_the_gateway_stay_at_their_figures(machine: Machine, unit: str) -> None:
    assert exposure(machine, unit) <= CEILINGS[unit]


def test_a_brokers_unit_stays_at_its_figure(machine: Machine, token: str) -> None:
    task = start_fake(machine, token, "step up\nsleep 120")
    wait_for_step(machine, task["id"])
    try:
        assert exposure(machine, f"box-broker@{task['id']}.service") <= CEILINGS["box-broker@"]
    finally:
        http(machine, "POST", f"/api/tasks/{task['id']}/stop", token)


def test_the_managers_sandbox_is_what_it_claims(machine: Machine) -> None:
    assert shown(
        machine,
        "boxd.service",
        "UMask",
        "NoNewPrivileges",
        "PrivateNetwork",
        "PrivateMounts",
        "RestrictAddressFamilies",
        "RestrictNamespaces",
        "DevicePolicy",
        "MemoryDenyWriteExecute",
        "CapabilityBoundingSet",
    ) == {
        "UMask": "0077",
        "NoNewPrivileges": "yes",
        "PrivateNetwork": "yes",
        "PrivateMounts": "no",
        "RestrictAddressFamilies": "AF_NETLINK AF_UNIX",
        "RestrictNamespaces": "net mnt",
        "DevicePolicy": "closed",
        "MemoryDenyWriteExecute": "yes",
        "CapabilityBoundingSet": (
            "cap_chown cap_dac_override cap_dac_read_search cap_fowner cap_fsetid cap_kill "
            "cap_setgid cap_setuid cap_net_admin cap_sys_admin cap_audit_write"
        ),
    }
    # It shares the machine's mount namespace, where the tasks' views must be seen, but not
    # its network.
    pid = shown(machine, "boxd.service", "MainPID")["MainPID"]
    namespaces = machine.run(
        "readlink", "/proc/1/ns/mnt", f"/proc/{pid}/ns/mnt", "/proc/1/ns/net", f"/proc/{pid}/ns/net"
    ).stdout.split()
    assert namespaces[0] == namespaces[1]
    assert namespaces[2] != namespaces[3]


def seen_of_box_home(machine: Machine, unit: str) -> list[str]:
    pid = shown(machine, unit, "MainPID")["MainPID"]
    found = machine.run("nsenter", "-t", pid, "-m", "find", "/var/lib/box", "-maxdepth", "3")
    return sorted(found.stdout.split())


def test_the_broker_sees_nothing_of_box_home(machine: Machine, token: str) -> None:
    """Not even its own task's files (the manager flushes them before it logs a step), nor any
    app's state: the apps' runners keep theirs."""
    task = start_fake(machine, token, "step up\nsleep 120")
    wait_for_step(machine, task["id"])
    try:
        assert seen_of_box_home(machine, f"box-broker@{task['id']}.service") == ["/var/lib/box"]
    finally:
        http(machine, "POST", f"/api/tasks/{task['id']}/stop", token)


def test_an_apps_runner_stays_at_its_figure_and_sees_its_own_state(
    machine: Machine, token: str
) -> None:
    task = start_fake(machine, token, 'call echo.say {"text": "hi"}', tools=["echo.say"])
    assert finish(machine, task["id"])["state"] == "done"
    assert exposure(machine, "box-app@echo.service") <= CEILINGS["box-app@"]
    assert seen_of_box_home(machine, "box-app@echo.service") == [
        "/var/lib/box",
        "/var/lib/box/apps",
        "/var/lib/box/apps/echo",
    ]
    assert shown(machine, "box-app@echo.service", "User", "PrivateUsers") == {
        "User": "boxd-app-echo",
        "PrivateUsers": "yes",
    }


@pytest.mark.parametrize("unit", ["boxd.service", "boxd-droid-install.service"])
def test_the_documentation_a_unit_names_is_installed(machine: Machine, unit: str) -> None:
    # `systemctl help` opens these: each must be a file the package put there.
    pages = shown(machine, unit, "Documentation")["Documentation"].split()
    assert pages, f"{unit} names no documentation"
    for page in pages:
        assert page.startswith("file:///"), page
        assert (machine.root / page.removeprefix("file:///")).is_file(), f"{page} is not installed"
