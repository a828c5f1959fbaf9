"""Pausing the agents: new tasks stay queued, across a restart of boxd, until the owner resumes;
then they start in the order they came. Running tasks carry on. Only the owner pauses."""

import json
from typing import Any

from testbed.box_api import boxctl, finish, http, start_fake, wait_for_step
from testbed.machine import Machine

OWNER_ONLY = (
    403,
    {"error": "only this computer's own screen or the owner's paired device can do this"},
)


def _shown(machine: Machine, task_id: str) -> dict[str, Any]:
    task = json.loads(boxctl(machine, "show", task_id, "--json").stdout)
    assert isinstance(task, dict)
    return task


def _unit_active(machine: Machine, task_id: str) -> bool:
    unit = f"box-task-{task_id}.service"
    done = machine.run("systemctl", "is-active", unit, check=False)
    return done.stdout.strip() in ("active", "activating")


def test_an_apps_token_cannot_pause_or_resume(machine: Machine, token: str) -> None:
    app = boxctl(machine, "token", "create", "--name", "pauser", "--app").stdout.strip()
    assert http(machine, "POST", "/api/pause", app) == OWNER_ONLY
    assert http(machine, "POST", "/api/resume", app) == OWNER_ONLY
    assert http(machine, "GET", "/api/pause", app) == OWNER_ONLY
    # The same door on D-Bus, behind the HTTP API.
    refused = machine.run(
        "busctl",
        "call",
        "org.boxd.Box1",
        "/org/boxd/Box1",
        "org.boxd.Box1.Gateway",
        "PauseAgents",
        "s",
        app,
        user="nobody",
        check=False,
    )
    assert refused.returncode != 0 and OWNER_ONLY[1]["error"] in refused.stderr, refused.stderr
    # Without a token the manager's own interface asks polkit, which says no to a stranger.
    stranger = machine.run(
        "busctl",
        "call",
        "org.boxd.Box1",
        "/org/boxd/Box1",
        "org.boxd.Box1.Manager",
        "PauseAgents",
        user="nobody",
        check=False,
    )
    assert stranger.returncode != 0
    assert http(machine, "GET", "/api/pause", token) == (200, {"paused": False})
    # Nothing of that paused anything: a new task starts.
    task = start_fake(machine, token, "step not paused")
    assert task["state"] != "queued", task
    assert finish(machine, task["id"])["state"] == "done"


def test_paused_agents_hold_new_tasks_queued_across_a_restart(machine: Machine, token: str) -> None:
    before = json.loads(boxctl(machine, "settings", "--json").stdout)["maxRunningTasks"]
    running = start_fake(machine, token, "step up\nsleep 60", title="running before the pause")
    wait_for_step(machine, running["id"])
    said = boxctl(machine, "pause").stdout
    assert "paused" in said and "boxctl resume" in said, said
    try:
        assert http(machine, "GET", "/api/pause", token) == (200, {"paused": True})
        first = start_fake(machine, token, "step first", title="first")
        second = start_fake(machine, token, "step second", title="second")
        # create_task admits before it answers: these answers are the decision.
        assert (first["state"], second["state"]) == ("queued", "queued")
        # A task that was running carries on through the pause.
        assert _shown(machine, running["id"])["state"] == "running"
        assert _unit_active(machine, running["id"])

        # boxd tells systemd it is ready only after it has started what it would start.
        machine.run("systemctl", "restart", "boxd.service")
        assert http(machine, "GET", "/api/pause", token) == (200, {"paused": True})
        for task in (first, second):
            assert _shown(machine, task["id"])["state"] == "queued"
            assert not _unit_active(machine, task["id"])
        assert _shown(machine, running["id"])["state"] == "running"

        # One place at a time, so the order they start in shows.
        boxctl(machine, "stop", running["id"])
        assert finish(machine, running["id"])["state"] == "failed"
        boxctl(machine, "settings", "set", "maxRunningTasks", "1")
        assert http(machine, "POST", "/api/resume", token) == (200, {"paused": False})
        ended = [finish(machine, task["id"]) for task in (first, second)]
        assert [t["state"] for t in ended] == ["done", "done"], ended
        assert ended[0]["steps"][0]["at"] < ended[1]["steps"][0]["at"]
        # Over HTTP, the owner's token pauses as well.
        assert http(machine, "POST", "/api/pause", token) == (200, {"paused": True})
        assert start_fake(machine, token, "step held")["state"] == "queued"
    finally:
        boxctl(machine, "resume")
        boxctl(machine, "settings", "set", "maxRunningTasks", str(before))
    assert http(machine, "GET", "/api/pause", token) == (200, {"paused": False})
