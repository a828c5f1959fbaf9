"""boxd installs Droid itself, with boxd-droid-install.service, from a registry stand-in in the
machine: only the published bytes install anything; Droid tasks wait `queued` without holding
a place while it installs, start once it is there, and fail in plain words when it could not
be; boxd's next start tries again. Claude Code's install as the owner sees it, before, while and
after the first Claude task installs it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from boxd.claude.installer import CLAUDE
from boxd.droid.installer import DROID
from boxd.droid.release import VERSION, droid_binary
from testbed.box_api import boxctl, busctl_call, busctl_result, finish, http, start_fake
from testbed.droid_cache import claude_tarball
from testbed.machine import Machine, booted_box
from testbed.npm_registry import (
    ADDRESS,
    INSTALL_UNIT,
    NpmRegistry,
    droid_state,
    install_droid,
    restart_boxd,
    wait_for_droid,
)

BINARY = str(droid_binary())
VERSION_DIR = str(droid_binary().parent)
# The size of the binary in the published package.
BINARY_BYTES = 253973984
TRY_AGAIN = "boxd tries again the next time it starts (systemctl restart boxd)."


@pytest.fixture(scope="module")
def machine() -> Iterator[Machine]:
    """A machine of this module's own: these tests restart boxd and install Droid."""
    yield from booted_box()


@pytest.fixture
def registry(machine: Machine) -> Iterator[NpmRegistry]:
    """The stand-in, not started; Droid not installed."""
    machine.run("rm", "-rf", VERSION_DIR)
    stand_in = NpmRegistry(machine)
    yield stand_in
    stand_in.stop()


def start_droid(machine: Machine, token: str) -> dict[str, Any]:
    body = json.dumps({"title": "droid", "prompt": "Write a five-line summary to summary.md."})
    status, task = http(machine, "POST", "/api/tasks", token, body)
    assert status == 201, task
    assert isinstance(task, dict)
    return task


def shown(machine: Machine, task_id: str) -> dict[str, Any]:
    task = json.loads(boxctl(machine, "show", task_id, "--json").stdout)
    assert isinstance(task, dict)
    return task


def wait_while_queued(machine: Machine, task_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (task := shown(machine, task_id))["state"] == "queued":
        assert time.monotonic() < deadline, "the Droid task is still queued"
        time.sleep(0.1)
    return task


def nothing_installed(machine: Machine) -> None:
    assert machine.run("test", "-e", BINARY, check=False).returncode != 0
    # Neither the impostor's binary nor a download or a half-written file is left behind.
    left = machine.run("find", "/var/lib/boxd/droid", "-mindepth", "1", "-not", "-type", "d")
    assert left.stdout == ""
    assert machine.run("test", "-e", "/tmp/impostor-ran", check=False).returncode != 0


def test_a_registry_serving_other_bytes_installs_nothing_and_droid_tasks_fail(
    machine: Machine, token: str, registry: NpmRegistry
) -> None:
    registry.start(serve="wrong", hold=True)
    restart_boxd(machine)
    registry.wait_until_held()
    assert droid_state(machine) == {
        "version": VERSION,
        "installed": False,
        "installing": True,
        "error": None,
    }
    task = start_droid(machine, token)
    assert task["state"] == "queued"
    registry.release()
    ended = finish(machine, task["id"])
    url = DROID.tarball_url(ADDRESS)
    words = (
        f"Droid could not be installed: {url} did not serve Droid {VERSION} as published "
        f"(its sha512 differs). {TRY_AGAIN}"
    )
    assert ended["state"] == "failed"
    assert ended["error"] == words
    nothing_installed(machine)
    # A new Droid task fails at once, saying the same.
    later = start_droid(machine, token)
    assert (later["state"], later["error"]) == ("failed", words)
    status, said = http(machine, "GET", "/api/droid", token)
    assert status == 200
    assert said == {"version": VERSION, "installed": False, "installing": False, "error": words}
    assert boxctl(machine, "droid").stdout.strip() == words


def test_a_missing_package_says_so(machine: Machine, registry: NpmRegistry) -> None:
    registry.start(serve="missing")
    restart_boxd(machine)
    state = wait_for_droid(machine)
    assert state["error"] == (
        f"Droid could not be installed: {DROID.tarball_url(ADDRESS)} answered 404 Not Found. "
        + TRY_AGAIN
    )
    nothing_installed(machine)


def test_droid_tasks_wait_queued_without_a_place_and_start_once_installed(
    machine: Machine, token: str, registry: NpmRegistry
) -> None:
    before = json.loads(boxctl(machine, "settings", "--json").stdout)["maxRunningTasks"]
    boxctl(machine, "settings", "set", "maxRunningTasks", "1")
    try:
        registry.start(hold=True)
        restart_boxd(machine)
        registry.wait_until_held()
        status, said = http(machine, "GET", "/api/droid", token)
        assert (status, said["installing"], said["installed"]) == (200, True, False)
        assert "being installed" in boxctl(machine, "droid").stdout
        droid = start_droid(machine, token)
        assert droid["state"] == "queued"
        # The only place is free for a fake task while the Droid task waits for its install.
        fake = start_fake(machine, token, "step while droid installs")
        assert finish(machine, fake["id"])["state"] == "done"
        assert shown(machine, droid["id"])["state"] == "queued"
        assert droid_state(machine)["installing"] is True
        registry.release()
        assert wait_for_droid(machine) == {
            "version": VERSION,
            "installed": True,
            "installing": False,
            "error": None,
        }
        started = wait_while_queued(machine, droid["id"])
        # Past the install: what happens next is the Droid worker's, not the install's.
        assert not (started["error"] or "").startswith("Droid could not be installed")
    finally:
        boxctl(machine, "settings", "set", "maxRunningTasks", str(before))
    owner_mode_size = machine.run("stat", "-c", "%U %a %s", BINARY).stdout.split()
    assert owner_mode_size == ["root", "755", str(BINARY_BYTES)]
    assert machine.run("ls", "-A", VERSION_DIR).stdout.split() == ["droid"]


def test_the_next_start_tries_again_and_an_installed_droid_is_left_alone(
    machine: Machine, registry: NpmRegistry
) -> None:
    registry.start(serve="missing")
    restart_boxd(machine)
    assert wait_for_droid(machine)["error"] is not None
    registry.mode("good")
    restart_boxd(machine)
    assert wait_for_droid(machine)["installed"] is True
    served = registry.state()["served"]
    # Installed: boxd's next start asks the registry for nothing, nor does the unit itself.
    registry.mode("wrong", hold=True)
    restart_boxd(machine)
    assert droid_state(machine)["installed"] is True
    machine.run("systemctl", "start", INSTALL_UNIT, timeout=30)
    assert registry.state() == {"waiting": 0, "served": served, "serve": "wrong"}
    said = machine.run(
        "journalctl", "-u", INSTALL_UNIT, "_TRANSPORT=stdout", "-o", "cat", "-n", "1"
    ).stdout
    assert said.strip() == f"boxd: Droid {VERSION} is already installed at {BINARY}"


def test_install_droid_gets_it_there_for_other_tests(
    machine: Machine, registry: NpmRegistry
) -> None:
    install_droid(machine)
    assert droid_state(machine)["installed"] is True
    assert machine.run("test", "-x", BINARY, check=False).returncode == 0
    # And leaves the machine's registry as it was: the drop-in gone.
    environment = machine.run("systemctl", "show", "-p", "Environment", INSTALL_UNIT).stdout
    assert environment.strip() == "Environment="


def test_the_install_unit_writes_only_droids_folder_with_no_capability(machine: Machine) -> None:
    properties = ("ProtectSystem", "ReadWritePaths", "CapabilityBoundingSet", "PrivateUsers")
    text = machine.run(
        "systemctl", "show", INSTALL_UNIT, *(f"--property={name}" for name in properties)
    ).stdout
    assert dict(line.partition("=")[::2] for line in text.splitlines()) == {
        "ProtectSystem": "strict",
        "ReadWritePaths": "/var/lib/boxd/droid",
        "CapabilityBoundingSet": "",
        "PrivateUsers": "yes",
    }


def test_only_the_owner_sees_droids_state(machine: Machine, token: str) -> None:
    app = boxctl(machine, "token", "create", "--name", "shop", "--app").stdout.strip()
    status, said = http(machine, "GET", "/api/droid", app)
    assert (status, said) == (
        403,
        {"error": "only this computer's own screen or the owner's paired device can do this"},
    )
    assert http(machine, "GET", "/api/droid", None)[0] == 401
    machine.run("sh", "-c", "id stranger >/dev/null 2>&1 || useradd -m stranger")
    refused = boxctl(machine, "droid", user="stranger", check=False)
    assert refused.returncode == 1
    assert "Only the box's owner may do this" in refused.stderr
    assert http(machine, "GET", "/api/droid", token)[0] == 200


def claude_state(machine: Machine) -> dict[str, Any]:
    found = json.loads(boxctl(machine, "claude", "--json").stdout)
    assert isinstance(found, dict)
    return found


def test_the_owner_sees_claude_code_s_install_before_while_and_after_it(
    machine: Machine, token: str, registry: NpmRegistry
) -> None:
    claude_tarball()
    machine.run("rm", "-rf", str(CLAUDE.installed().parent))
    registry.start(hold=True, unit="boxd-claude-install.service")
    restart_boxd(machine)
    missing = {"version": CLAUDE.version, "installed": False, "installing": False, "error": None}
    assert claude_state(machine) == missing
    assert http(machine, "GET", "/api/claude", token) == (200, missing)
    assert busctl_result(busctl_call(machine, "GetClaude")) == missing
    assert boxctl(machine, "claude").stdout.strip() == (
        f"Claude Code {CLAUDE.version} is not installed; boxd installs it for the first Claude "
        "task."
    )
    body = {"title": "claude", "prompt": "Say hello.", "worker": "claude"}
    status, task = http(machine, "POST", "/api/tasks", token, json.dumps(body))
    assert (status, task["state"]) == (201, "queued"), task
    registry.wait_until_held()
    assert claude_state(machine) == {**missing, "installing": True}
    assert boxctl(machine, "claude").stdout.strip() == (
        f"Claude Code {CLAUDE.version} is being installed; Claude tasks wait, queued, until it is."
    )
    registry.release()
    deadline = time.monotonic() + 120
    while (state := claude_state(machine))["installing"]:
        assert time.monotonic() < deadline, "Claude Code still installing after 120 s"
        time.sleep(0.1)
    assert state == {**missing, "installed": True}
    assert http(machine, "GET", "/api/claude", token) == (200, state)
    assert boxctl(machine, "claude").stdout.strip() == f"Claude Code {CLAUDE.version} is installed."
    machine.run("test", "-x", str(CLAUDE.installed()))
    # The task ran or runs on past its install (no model here): what it does is not the install's.
    boxctl(machine, "stop", task["id"], check=False)
    assert finish(machine, task["id"])["state"] in {"stopped", "failed", "done"}
