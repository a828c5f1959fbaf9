"""Who may do what: polkit for D-Bus callers, bearer tokens for HTTP, 0600 broker sockets."""

import json

from testbed.box_api import (
    CURL_COULD_NOT_CONNECT,
    boxctl,
    busctl_call,
    database_bytes,
    http,
    start_fake,
    wait_for_step,
)
from testbed.machine import Machine

REFUSED = (
    "Only the box's owner may do this: the caller is not root and not in group boxd-owner "
    "(polkit refused org.boxd.Box1.manage)."
)


def test_a_stranger_is_refused_and_the_owner_allowed(machine: Machine, owner: str) -> None:
    machine.run("sh", "-c", "id stranger >/dev/null 2>&1 || useradd -m stranger")
    refused = boxctl(machine, "list", user="stranger", check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip() == f"boxctl: {REFUSED}"
    over_busctl = busctl_call(machine, "ListTasks", "", user="stranger", check=False)
    assert over_busctl.returncode != 0
    assert REFUSED in over_busctl.stderr
    create = busctl_call(
        machine,
        "CreateTask",
        json.dumps({"title": "x", "prompt": "step x", "worker": "fake"}),
        user="stranger",
        check=False,
    )
    assert create.returncode != 0 and REFUSED in create.stderr
    allowed = boxctl(machine, "list", "--json", user=owner)
    assert isinstance(json.loads(allowed.stdout), list)
    token = boxctl(machine, "token", "create", "--name", "owner's laptop", user=owner).stdout
    assert token.strip().startswith("box_")


def test_http_needs_a_known_bearer_token(machine: Machine, token: str) -> None:
    body = json.dumps({"title": "x", "prompt": "step x", "worker": "fake"})
    expected = {"error": "send Authorization: Bearer <token> (boxctl token create makes one)"}
    assert http(machine, "POST", "/api/tasks", None, body) == (401, expected)
    assert http(machine, "GET", "/api/tasks", None) == (401, expected)
    status, answer = http(machine, "GET", "/api/tasks", "box_not-a-real-token")
    assert status == 401
    assert answer == {"error": "a valid bearer token is required (boxctl token create)"}
    assert http(machine, "GET", "/api/tasks", token)[0] == 200


def test_tokens_are_stored_hashed(machine: Machine, token: str) -> None:
    dump = database_bytes(machine)
    assert token not in dump


def test_broker_socket_belongs_to_its_task_alone(machine: Machine, token: str) -> None:
    first = start_fake(machine, token, "step up\nsleep 60")
    second = start_fake(machine, token, "step up\nsleep 60")
    wait_for_step(machine, first["id"])
    wait_for_step(machine, second["id"])
    sock = f"/var/lib/box/tasks/{first['id']}/broker.sock"
    assert machine.run("stat", "-c", "%U %a %F", sock).stdout.split() == [
        first["user"],
        "600",
        "socket",
    ]
    own = machine.run("curl", "-sS", "--unix-socket", sock, "http://box/task", user=first["user"])
    assert json.loads(own.stdout)["task"]["id"] == first["id"]
    tools = machine.run(
        "curl", "-sS", "--unix-socket", sock, "http://box/tools", user=first["user"]
    )
    assert json.loads(tools.stdout) == []
    other = machine.run(
        "curl", "-sS", "--unix-socket", sock, "http://box/task", user=second["user"], check=False
    )
    assert other.returncode != 0
    assert "Permission denied" in other.stderr or CURL_COULD_NOT_CONNECT.search(other.stderr)
    for task in (first, second):
        boxctl(machine, "stop", task["id"])
