"""Workspaces over HTTP, D-Bus and boxctl."""

import json

from testbed.box_api import boxctl, finish, http, start_fake, wait_for_step
from testbed.machine import Machine


def test_workspaces_over_http_and_boxctl(machine: Machine, token: str) -> None:
    status, made = http(machine, "POST", "/api/workspaces", token, json.dumps({"name": "notes"}))
    assert (status, made) == (201, {"name": "notes", "path": "/var/lib/box/workspaces/notes"})
    assert http(machine, "POST", "/api/workspaces", token, json.dumps({"name": "notes"})) == (
        400,
        {"error": "workspace notes already exists"},
    )
    status, refused = http(machine, "POST", "/api/workspaces", token, json.dumps({"name": "a b"}))
    assert status == 400 and "is not a workspace name" in refused["error"]
    assert http(machine, "GET", "/api/workspaces", None)[0] == 401
    status, listed = http(machine, "GET", "/api/workspaces", token)
    assert status == 200 and {"home", "notes"} <= {w["name"] for w in listed}
    assert "notes" in boxctl(machine, "workspace", "ls").stdout

    task = start_fake(machine, token, "step on notes\nsleep 30", workspace="notes")
    assert task["workspace"] == "notes"
    wait_for_step(machine, task["id"])
    busy = boxctl(machine, "workspace", "rm", "notes", check=False)
    assert busy.stderr.strip() == (
        f"boxctl: workspace notes has unfinished tasks ({task['id']}); stop them first"
    )
    boxctl(machine, "stop", task["id"])
    finish(machine, task["id"])
    machine.run("sh", "-c", "echo mine > /var/lib/box/workspaces/notes/keep.txt")
    removed = json.loads(boxctl(machine, "workspace", "rm", "notes", "--json").stdout)
    assert removed["trash"].startswith("/var/lib/box/trash/notes-")
    assert machine.run("cat", f"{removed['trash']}/keep.txt").stdout == "mine\n"
    home = boxctl(machine, "workspace", "rm", "home", check=False)
    assert "home is the box's default workspace; it cannot be removed" in home.stderr


def test_only_the_owner_manages_workspaces(machine: Machine) -> None:
    machine.run("sh", "-c", "id stranger >/dev/null 2>&1 || useradd -m stranger")
    refused = boxctl(machine, "workspace", "create", "mine", user="stranger", check=False)
    assert refused.returncode == 1 and "Only the box's owner may do this" in refused.stderr
