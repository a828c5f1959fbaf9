"""A business owner's members, as their tokens would try the box: a member starts tasks, which
the box marks with their id as `requester`, and sees, follows and stops only their own;
everything else is the owner's, refused in the seed's words."""

import json
from typing import Any

from testbed.box_api import boxctl, finish, http, start_fake, wait_for_step
from testbed.machine import Machine

OWNER_ONLY = (
    403,
    {"error": "only this computer's own screen or the owner's paired device can do this"},
)


def _gateway(machine: Machine, member: str, signature: str, *args: str) -> Any:
    return machine.run(
        "busctl",
        "call",
        "org.boxd.Box1",
        "/org/boxd/Box1",
        "org.boxd.Box1.Gateway",
        member,
        signature,
        *args,
        user="nobody",
        check=False,
    )


def test_a_member_cannot_choose_the_requester_or_act_as_the_owner(
    machine: Machine, token: str
) -> None:
    anna = boxctl(machine, "token", "create", "--member", "u-anna").stdout.strip()
    # Set by the box, never by the caller: the body's requester is refused, whoever sends it.
    for sender in (anna, token):
        body = json.dumps(
            {"title": "x", "prompt": "step hi", "worker": "fake", "requester": "u-boss"}
        )
        status, said = http(machine, "POST", "/api/tasks", sender, body)
        assert status == 400 and "requester" in said["error"], said
    mine = start_fake(machine, anna, "ask may I?\nstep asked", title="anna's")
    assert mine["requester"] == "u-anna" and "app" not in mine
    owners = start_fake(machine, token, "step hi\nsleep 60", title="the owner's")
    assert "requester" not in owners
    wait_for_step(machine, owners["id"])
    done = start_fake(machine, anna, "write a.txt anna's", title="anna's, done")
    assert finish(machine, done["id"])["state"] == "done"

    for method, path, sent in (
        ("GET", f"/api/tasks/{owners['id']}", None),
        ("POST", f"/api/tasks/{owners['id']}/stop", None),
        ("POST", f"/api/tasks/{done['id']}/undo", None),
        ("POST", f"/api/tasks/{done['id']}/keep", None),
        ("GET", "/api/approvals", None),
        ("POST", f"/api/approvals/{mine['id']}.line-1", json.dumps({"approved": True})),
        ("GET", "/api/workspaces", None),
        ("POST", "/api/workspaces", json.dumps({"name": "annas"})),
        ("GET", "/api/tokens", None),
        ("DELETE", "/api/tokens/u-anna", None),
        ("GET", "/api/droid", None),
        ("GET", "/api/claude", None),
        ("GET", "/api/pause", None),
        ("POST", "/api/pause", None),
        ("POST", "/api/resume", None),
    ):
        assert http(machine, method, path, anna, sent) == OWNER_ONLY, path
    # The same door on D-Bus; the owner's own account's methods are not there at all.
    for member, signature, args in (
        ("UndoTask", "ss", (anna, done["id"])),
        ("ListApprovals", "ss", (anna, "")),
        ("PauseAgents", "s", (anna,)),
    ):
        refused = _gateway(machine, member, signature, *args)
        assert refused.returncode != 0 and OWNER_ONLY[1]["error"] in refused.stderr, member
    made = _gateway(machine, "CreateToken", "ssss", anna, "u-boss", "owner", "")
    assert made.returncode != 0 and OWNER_ONLY[1]["error"] in made.stderr, made.stderr
    # Nothing of that took effect.
    assert finish(machine, done["id"], timeout=5)["state"] == "done"
    status, pending = http(machine, "GET", "/api/approvals", token)
    assert status == 200 and f"{mine['id']}.line-1" in [a["id"] for a in pending]
    assert "u-boss" not in boxctl(machine, "token", "ls").stdout
    boxctl(machine, "stop", owners["id"])
    boxctl(machine, "stop", mine["id"])


def test_members_see_follow_and_stop_only_their_own(machine: Machine, token: str) -> None:
    ben = boxctl(machine, "token", "create", "--member", "u-ben").stdout.strip()
    cleo = boxctl(machine, "token", "create", "--member", "u-cleo").stdout.strip()
    # A second token for the same person (a new laptop) sees the same tasks.
    ben_again = boxctl(machine, "token", "create", "--member", "u-ben").stdout.strip()
    bens = start_fake(machine, ben, "step ben's\nsleep 60", title="ben's")
    cleos = start_fake(machine, cleo, "step cleo's\nsleep 60", title="cleo's")
    wait_for_step(machine, bens["id"])
    wait_for_step(machine, cleos["id"])

    for mine, theirs, tokens in ((bens, cleos, (ben, ben_again)), (cleos, bens, (cleo,))):
        for member in tokens:
            status, listed = http(machine, "GET", "/api/tasks", member)
            assert status == 200 and [t["id"] for t in listed] == [mine["id"]]
            status, shown = http(machine, "GET", f"/api/tasks/{mine['id']}", member)
            assert status == 200 and shown["steps"][0]["text"] == mine["title"]
            assert http(machine, "GET", f"/api/tasks/{theirs['id']}", member) == OWNER_ONLY
            stop = f"/api/tasks/{theirs['id']}/stop"
            assert http(machine, "POST", stop, member) == OWNER_ONLY
    # The owner sees everyone's, with who asked.
    status, everyone = http(machine, "GET", "/api/tasks", token)
    by_id = {t["id"]: t for t in everyone}
    assert by_id[bens["id"]]["requester"] == "u-ben"
    assert by_id[cleos["id"]]["requester"] == "u-cleo"

    status, stopped = http(machine, "POST", f"/api/tasks/{bens['id']}/stop", ben_again)
    assert status == 200 and stopped["state"] == "failed", stopped
    shown = json.loads(boxctl(machine, "show", cleos["id"], "--json").stdout)
    assert shown["state"] == "running"
    status, stopped = http(machine, "POST", f"/api/tasks/{cleos['id']}/stop", cleo)
    assert status == 200 and stopped["state"] == "failed"

    listed = json.loads(boxctl(machine, "token", "ls", "--json").stdout)
    ours = [t for t in listed if t["name"] in ("u-ben", "u-cleo")]
    assert sorted((t["name"], t["role"]) for t in ours) == [
        ("u-ben", "member"),
        ("u-ben", "member"),
        ("u-cleo", "member"),
    ]
    assert "member" in boxctl(machine, "token", "ls").stdout


def test_a_members_token_is_made_in_plain_words(machine: Machine) -> None:
    named = boxctl(machine, "token", "create", "--member", "u-1", "--name", "x", check=False)
    assert named.returncode == 1
    assert "a member's token is named by their id: leave out --name" in named.stderr
    spaced = boxctl(machine, "token", "create", "--member", "anna smith", check=False)
    assert spaced.returncode == 1
    assert "a member's id must be 1 to 100 printable characters without spaces" in spaced.stderr
    both = boxctl(machine, "token", "create", "--member", "u-1", "--app", check=False)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    # Straight on D-Bus, the role is named and checked.
    wrong = machine.run(
        "busctl",
        "call",
        "org.boxd.Box1",
        "/org/boxd/Box1",
        "org.boxd.Box1.Manager",
        "CreateToken",
        "sss",
        "sneaky",
        "broker",
        "",
        check=False,
    )
    assert wrong.returncode != 0
    assert "a token's role must be one of owner, app, member, not 'broker'" in wrong.stderr
