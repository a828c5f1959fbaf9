"""A newer boxd installed over a running one with apt (docs/install.md, "Upgrading"), while tasks
log steps, pay, write files and wait for the owner: nothing acknowledged is lost, what waited
for the owner still waits and is answered after, every task goes on to its end.

Version N is this tree as pyproject numbers it; N+1 is the same tree numbered one higher, so what
is tested is the upgrade itself (the units, the maintainer scripts, the restart), not a change
of code. The record's own steps forward are tests/manager/record's."""

import json
import random
import time
import tomllib
from collections.abc import Iterator

import pytest

from testbed.box_api import http
from testbed.chaos import (
    ACKS_DIR,
    WORKSPACES,
    Figures,
    Owner,
    Planned,
    check,
    ensure_workspaces,
    plan_task,
    round_seed,
    start_tasks,
    wait_for_boxd,
    wait_for_no_leftovers,
    wait_until_ended,
)
from testbed.image import REPO_ROOT
from testbed.machine import Machine, apt_install, booted_box, stage_deb, wait_active

TASKS = 6
# How long the tasks get to be under way (and one to ask its question) before the upgrade.
UNDER_WAY_SECONDS = 60.0


def version_n() -> str:
    with (REPO_ROOT / "pyproject.toml").open("rb") as f:
        version: str = tomllib.load(f)["project"]["version"]
    return version


NEWER = f"{version_n()}+1"


@pytest.fixture(scope="module")
def machine() -> Iterator[Machine]:
    """A box of its own, at version N: the test replaces its package."""
    yield from booted_box()


def installed_version(machine: Machine) -> str:
    return machine.run("dpkg-query", "-W", "-f=${Version}", "boxd").stdout.strip()


def main_pid(machine: Machine, unit: str) -> str:
    return machine.run("systemctl", "show", "-P", "MainPID", unit).stdout.strip()


def waiting_approvals(machine: Machine, token: str) -> set[str]:
    status, listed = http(machine, "GET", "/api/approvals", token)
    assert status == 200 and isinstance(listed, list), listed
    return {a["id"] for a in listed}


def running_tasks(machine: Machine) -> set[str]:
    listed = machine.run(
        "systemctl", "list-units", "--plain", "--no-legend", "--state=active", "box-task-*"
    ).stdout
    return {line.split()[0].removeprefix("box-task-").split(".")[0] for line in listed.splitlines()}


def asking(seed: int) -> Planned:
    """A task sure to be waiting for the owner when the upgrade comes: it asks at once."""
    tag = f"{seed}-asks"
    script = "\n".join(
        [
            f"acks {ACKS_DIR}/{tag}.jsonl",
            "step asks before the upgrade",
            f"ask may task {tag} go on after the upgrade?",
            "step goes on after the upgrade",
        ]
    )
    return Planned(TASKS, tag, WORKSPACES[0], script, {})


@pytest.mark.smoke
def test_an_upgrade_with_tasks_running_loses_nothing(machine: Machine, token: str) -> None:
    assert installed_version(machine) == version_n()
    # Built before the tasks start: the build is minutes the first time, and not the test's.
    newer = stage_deb(machine, NEWER)
    seed = round_seed()
    rng = random.Random(seed)
    print(f"upgrade round: seed {seed}", flush=True)
    ensure_workspaces(machine, token)
    planned = [plan_task(rng, seed, n) for n in range(TASKS)] + [asking(seed)]
    # The owner is away until the upgrade is done, so what asks waits through it.
    owner = Owner(machine, token, seed)
    owner.paused.set()
    owner.start()
    try:
        start_tasks(machine, token, planned)
        deadline = time.monotonic() + UNDER_WAY_SECONDS
        while not waiting_approvals(machine, token) and time.monotonic() < deadline:
            time.sleep(0.2)
        waiting = waiting_approvals(machine, token)
        assert waiting, "no task asked the owner anything before the upgrade"
        under_way = running_tasks(machine) & {p.id for p in planned}
        assert under_way, "no task was running when the upgrade came"
        manager = main_pid(machine, "boxd.service")

        started = time.monotonic()
        apt_install(machine, newer)
        took = time.monotonic() - started
        wait_active(machine, "boxd.service", 30, f"apt-get install {newer}")
        wait_for_boxd(machine, token)
        print(f"  apt-get install of {NEWER} over {version_n()}: {took:.1f} s", flush=True)

        assert installed_version(machine) == NEWER
        # The manager runs the new package's code: it was started again by the upgrade.
        assert main_pid(machine, "boxd.service") not in ("0", manager)
        # Nothing answered for the owner while the box changed under the tasks.
        assert waiting <= waiting_approvals(machine, token), "an approval stopped waiting"
        owner.paused.clear()
        wait_until_ended(machine, token, planned)
    finally:
        owner.stop()
    problems = check(machine, planned, owner, Figures()) + wait_for_no_leftovers(machine, planned)
    assert problems == [], f"seed {seed}:\n" + "\n".join(problems)
    # Answered after the upgrade, each as the owner said.
    assert waiting <= set(owner.answered) | set(owner.already)
    for task in planned:
        status, ended = http(machine, "GET", f"/api/tasks/{task.id}", token)
        assert status == 200 and ended["state"] == "done", json.dumps(ended)[:2000]
