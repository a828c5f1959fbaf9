"""`boxd doctor` and `boxctl doctor` on real machines: on one with what boxd needs its checks
pass; on one whose processes may not call bpf() (so systemd silently ignores IPAddressDeny=)
the check of it fails, the owner is told so over D-Bus, HTTP and boxctl, and no task starts
until the machine boots with bpf() allowed. Each other check that can be broken for real is
broken, and says so in its words."""

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.box_api import boxctl, busctl_call, busctl_result, finish, http, start_fake
from testbed.browser import browser
from testbed.machine import Machine, booted_box
from testbed.screen_driver import LINK, until

BOXD = "/usr/lib/boxd/venv/bin/boxd"
OWNER = "owner"
BPF = "IPAddressDeny (BPF)"
# Words of boxd.wire.doctor every refused start begins with.
NO_TASK_STARTS = "boxd starts no task on this machine until it is fixed"
# What this test host cannot give a test machine, whatever boxd does: its cgroup controllers
# are held by cgroup v1 hierarchies (the host's PID 1 is not systemd), so a machine's cgroup v2
# has none; and Droid, which only some modules install. Both only advise.
HOST_LACKS = {"cgroup controllers", "Droid"}


def _doctor(
    machine: Machine, env: dict[str, str] | None = None, timeout: float = 60
) -> tuple[int, dict[str, Any]]:
    done = machine.run(BOXD, "doctor", "--json", check=False, env=env, timeout=timeout)
    return done.returncode, json.loads(done.stdout)


def _check(answer: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [check for check in answer["checks"] if check["name"] == name]
    assert isinstance(found, dict)
    return found


def _owner(machine: Machine) -> str:
    if machine.run("id", OWNER, check=False).returncode != 0:
        machine.run("useradd", "-m", "-G", "boxd-owner", OWNER)
    return OWNER


def test_on_a_machine_with_what_boxd_needs_every_check_passes(machine: Machine) -> None:
    status, answer = _doctor(machine)
    assert status == 0, answer
    assert answer["tasksStart"] is True and "refusal" not in answer
    failing = {check["name"] for check in answer["checks"] if not check["ok"]}
    assert failing <= HOST_LACKS, answer
    assert all(check["ok"] for check in answer["checks"] if check["blocks"])
    shown = machine.run(BOXD, "doctor", timeout=60).stdout
    assert f"ok     {BPF}" in shown and "ok     overlayfs" in shown
    # Nothing of the trials is left: no probe unit, no namespace, no stack of layers.
    assert (
        "boxd-doctor"
        not in machine.run(
            "systemctl", "list-units", "--all", "--plain", "--no-legend", "boxd-doctor-*"
        ).stdout
    )
    assert "boxd-doctor" not in machine.run("ip", "netns", "list").stdout
    assert ".doctor-" not in machine.run("ls", "-a", "/var/lib/box").stdout


def test_the_owner_asks_by_boxctl_busctl_and_http(machine: Machine, token: str) -> None:
    owner = _owner(machine)
    told = boxctl(machine, "doctor", user=owner, check=False)
    assert told.returncode == 0, told.stdout + told.stderr
    assert f"ok     {BPF}" in told.stdout
    answer = busctl_result(busctl_call(machine, "CheckMachine"))
    assert answer["tasksStart"] is True and _check(answer, BPF)["ok"] is True
    status, answer = http(machine, "GET", "/api/doctor", token)
    assert status == 200 and answer["tasksStart"] is True
    app = boxctl(machine, "token", "create", "--name", "doctor-app", "--app").stdout.strip()
    assert http(machine, "GET", "/api/doctor", app)[0] == 403


def test_a_check_whose_command_hangs_fails_in_its_time_and_its_command_is_killed(
    machine: Machine,
) -> None:
    """`ip` made to hang, as a command on a machine in trouble may: the network namespaces'
    check does not answer, is stopped after its time, says so and blocks; the others answer;
    the command it ran is not left running."""
    ip = machine.run("sh", "-c", "command -v ip").stdout.strip()
    hang = "/root/hanging-ip"
    machine.run("sh", "-c", f"printf '#!/bin/sh\\nexec sleep 86400\\n' > {hang}; chmod 755 {hang}")
    machine.run("mount", "--bind", hang, ip)
    try:
        status, answer = _doctor(machine, timeout=120)
    finally:
        machine.run("umount", ip)
    assert status == 1
    stuck = _check(answer, "network namespaces")
    assert (stuck["ok"], stuck["blocks"]) == (False, True)
    assert "did not answer in 30 s" in stuck["problem"] and "ip netns" in stuck["fix"]
    assert _check(answer, "overlayfs")["ok"] is True and _check(answer, BPF)["ok"] is True
    assert machine.run("pgrep", "-f", "sleep 86400", check=False).stdout == ""


@pytest.fixture(scope="module")
def no_bpf() -> Iterator[Machine]:
    """A machine whose processes may not call bpf(): systemd there starts units with
    IPAddressDeny= and only logs that it cannot enforce it."""
    yield from booted_box(bpf=False)


def test_without_bpf_boxd_doctor_says_ipaddressdeny_is_not_enforced(no_bpf: Machine) -> None:
    status, answer = _doctor(no_bpf)
    assert status == 1
    found = _check(answer, BPF)
    assert (found["ok"], found["blocks"]) == (False, True)
    assert "does not enforce IPAddressDeny=" in found["problem"]
    assert "--system-call-filter=bpf" in found["fix"]
    assert answer["tasksStart"] is False and BPF in answer["refusal"]
    shown = no_bpf.run(BOXD, "doctor", check=False, timeout=60)
    assert shown.returncode == 1 and f"FAILED {BPF}" in shown.stdout


def test_without_bpf_no_task_starts_and_the_owner_is_told_why(no_bpf: Machine) -> None:
    owner = _owner(no_bpf)
    told = boxctl(no_bpf, "doctor", user=owner, check=False)
    assert told.returncode == 1
    assert f"FAILED {BPF}" in told.stdout and "does not enforce IPAddressDeny=" in told.stdout
    refused = boxctl(no_bpf, "start", "--worker", "fake", "step hello", user=owner, check=False)
    assert refused.returncode == 1
    assert NO_TASK_STARTS in refused.stderr and BPF in refused.stderr
    token = boxctl(no_bpf, "token", "create", "--name", "doctor").stdout.strip()
    body = json.dumps({"title": "t", "prompt": "step hello", "worker": "fake"})
    status, error = http(no_bpf, "POST", "/api/tasks", token, body)
    assert status == 503
    assert error["error"].startswith(NO_TASK_STARTS) and BPF in error["error"]
    status, answer = http(no_bpf, "GET", "/api/doctor", token)
    assert status == 200 and answer["tasksStart"] is False
    assert answer["refusal"] == error["error"]
    # Nothing was recorded, and no worker, not even a spare's started ahead, ran.
    assert json.loads(boxctl(no_bpf, "list", "--json").stdout) == []
    units = no_bpf.run("systemctl", "list-units", "--all", "--plain", "--no-legend", "box-*")
    assert "box-task-" not in units.stdout and "box-broker@" not in units.stdout
    journal = no_bpf.run("journalctl", "-u", "boxd.service", "--no-pager", "-o", "cat").stdout
    assert "boxd starts no task until the failed checks above pass" in journal


def test_without_bpf_the_owners_screen_says_no_task_starts_and_why(no_bpf: Machine) -> None:
    owner = _owner(no_bpf)
    link = LINK.search(boxctl(no_bpf, "open", user=owner).stdout)
    assert link is not None
    with browser(no_bpf, owner) as driver:
        driver.get(link.group(1))
        banner = "#doctor-banner"
        shown = (
            "const e = document.querySelector(arguments[0]); "
            "return e && !e.hidden ? e.innerText : ''"
        )
        words = until(driver, lambda d: d.execute_script(shown, banner), "no doctor's banner")
        assert "No task starts on this machine until it is fixed" in words
        assert BPF in words and "does not enforce IPAddressDeny=" in words
        assert "boxctl doctor" in words


def test_polkit_without_boxds_action_is_advice(no_bpf: Machine) -> None:
    action = "/usr/share/polkit-1/actions/org.boxd.Box1.policy"
    no_bpf.run("mv", action, "/root/org.boxd.Box1.policy")
    try:
        no_bpf.run("systemctl", "restart", "polkit.service")
        _, answer = _doctor(no_bpf)
        found = _check(answer, "polkit")
        assert (found["ok"], found["blocks"]) == (False, False)
        assert "org.boxd.Box1.manage" in found["problem"]
    finally:
        no_bpf.run("mv", "/root/org.boxd.Box1.policy", action)
        no_bpf.run("systemctl", "restart", "polkit.service")
    assert _check(_doctor(no_bpf)[1], "polkit")["ok"] is True


def test_a_host_key_systemd_creds_cannot_use_blocks(no_bpf: Machine) -> None:
    key = "/var/lib/systemd/credential.secret"
    no_bpf.run("rm", "-f", key)
    no_bpf.run("sh", "-c", f"umask 077; printf 'too short' > {key}")
    try:
        _, answer = _doctor(no_bpf)
        found = _check(answer, "systemd-creds")
        assert (found["ok"], found["blocks"]) == (False, True)
        assert "credential.secret" in found["fix"]
        assert "systemd-creds" in answer["refusal"]
    finally:
        no_bpf.run("rm", "-f", key)
    assert _check(_doctor(no_bpf)[1], "systemd-creds")["ok"] is True


def test_a_box_home_nearly_full_is_advice(no_bpf: Machine) -> None:
    small = "/mnt/small-box-home"
    no_bpf.run("mkdir", "-p", small)
    no_bpf.run("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", small)
    try:
        no_bpf.run("fallocate", "-l", "40m", f"{small}/filler")
        _, answer = _doctor(no_bpf, env={"BOX_HOME": small})
        found = _check(answer, "disk space")
        assert (found["ok"], found["blocks"]) == (False, False)
        assert re.search(r"only 2\d MiB are free under BOX_HOME", found["problem"]), found
        assert _check(answer, "overlayfs")["ok"] is True
    finally:
        no_bpf.run("umount", small)


def test_booted_again_with_bpf_allowed_tasks_start(no_bpf: Machine) -> None:
    no_bpf.stop(keep_state=True)
    no_bpf.bpf = True
    no_bpf.start()
    no_bpf.run("systemctl", "start", "boxd.service", timeout=60)
    told = boxctl(no_bpf, "doctor", user=_owner(no_bpf), check=False)
    assert told.returncode == 0, told.stdout
    token = boxctl(no_bpf, "token", "create", "--name", "doctor-after").stdout.strip()
    task = start_fake(no_bpf, token, "step hello\nsh id -un")
    assert finish(no_bpf, task["id"])["state"] == "done"
