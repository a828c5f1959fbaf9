"""Callers and roles, as an app's token would try them: it may start tasks and see, follow and
stop the ones it started; everything else is the owner's. Tokens are listed and revoked."""

import json
from typing import Any

from testbed.box_api import boxctl, finish, http, start_fake, wait_for_step
from testbed.machine import Machine

OWNER_ONLY = (
    403,
    {"error": "only this computer's own screen or the owner's paired device can do this"},
)


def _gateway(machine: Machine, member: str, signature: str, *args: str) -> Any:
    """A call straight on the gateway's D-Bus interface, as a local process holding a token may
    make it: the role check must not live in the HTTP routes alone."""
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


def test_an_apps_token_starts_sees_and_stops_only_its_own(machine: Machine, token: str) -> None:
    app = boxctl(machine, "token", "create", "--name", "shop", "--app").stdout.strip()
    mine = start_fake(machine, app, "ask may I?\nstep asked", title="the app's")
    assert mine["app"] == "shop"
    # No caller chooses the app name: it is not a field of the request.
    body = json.dumps({"title": "x", "prompt": "step hi", "worker": "fake", "app": "shop"})
    assert http(machine, "POST", "/api/tasks", app, body)[0] == 400
    forged = start_fake(machine, token, "step hi", title="the owner's")
    assert "app" not in forged
    theirs = start_fake(machine, token, "step hi\nsleep 60", title="the owner's, running")
    done = start_fake(machine, token, "write a.txt owner's", title="the owner's, done")
    assert finish(machine, done["id"])["state"] == "done"
    wait_for_step(machine, theirs["id"])

    status, listed = http(machine, "GET", "/api/tasks", app)
    assert status == 200 and [t["id"] for t in listed] == [mine["id"]]
    assert http(machine, "GET", f"/api/tasks/{mine['id']}", app)[0] == 200
    for task in (theirs, done, forged):
        assert http(machine, "GET", f"/api/tasks/{task['id']}", app) == OWNER_ONLY
        assert http(machine, "POST", f"/api/tasks/{task['id']}/stop", app) == OWNER_ONLY
    # Undo and answers are the owner's, even for the app's own task.
    assert http(machine, "POST", f"/api/tasks/{done['id']}/undo", app) == OWNER_ONLY
    assert http(machine, "POST", f"/api/tasks/{mine['id']}/undo", app) == OWNER_ONLY
    assert http(machine, "GET", "/api/approvals", app) == OWNER_ONLY
    approval = f"{mine['id']}.line-1"
    answer = json.dumps({"approved": True})
    assert http(machine, "POST", f"/api/approvals/{approval}", app, answer) == OWNER_ONLY
    owners: tuple[tuple[str, str, str | None], ...] = (
        ("GET", "/api/workspaces", None),
        ("POST", "/api/workspaces", json.dumps({"name": "apps"})),
        ("GET", "/api/tokens", None),
        ("DELETE", "/api/tokens/shop", None),
    )
    for method, path, sent in owners:
        assert http(machine, method, path, app, sent) == OWNER_ONLY, path
    # Nothing of that took effect.
    assert finish(machine, done["id"], timeout=5)["state"] == "done"
    status, pending = http(machine, "GET", "/api/approvals", token)
    assert status == 200 and approval in [a["id"] for a in pending]
    # The same refusals on the D-Bus interface behind the HTTP API.
    for member, signature, args in (
        ("AnswerApproval", "ssb", (app, approval, "true")),
        ("ListApprovals", "ss", (app, "")),
        ("UndoTask", "ss", (app, done["id"])),
    ):
        refused = _gateway(machine, member, signature, *args)
        assert refused.returncode != 0, member
        assert OWNER_ONLY[1]["error"] in refused.stderr, (member, refused.stderr)
    # Settings and the vault are the owner's in person (polkit, the screen, a paired device):
    # no token of an app's or the owner's reaches them, nor makes a new token.
    before = boxctl(machine, "settings", "--json").stdout
    for member, signature, args in (
        ("SetSettings", "ss", (app, json.dumps({"defaultBudgetCents": 100000}))),
        ("SetSettings", "ss", (token, json.dumps({"defaultBudgetCents": 100000}))),
        ("SetSecret", "sss", (token, "mail.password", "stolen")),
    ):
        refused = _gateway(machine, member, signature, *args)
        assert refused.returncode != 0, member
        assert OWNER_ONLY[1]["error"] in refused.stderr, (member, refused.stderr)
    for holder in (app, token):
        refused = _gateway(machine, "CreateToken", "ssss", holder, "mine now", "owner", "")
        assert refused.returncode != 0, holder
        assert OWNER_ONLY[1]["error"] in refused.stderr, refused.stderr
    assert boxctl(machine, "settings", "--json").stdout == before
    assert "mail.password" not in boxctl(machine, "vault", "ls").stdout
    assert http(machine, "POST", f"/api/tasks/{mine['id']}/stop", app)[0] == 200
    boxctl(machine, "stop", theirs["id"])


def test_tokens_are_listed_and_a_revoked_one_is_refused_at_once(
    machine: Machine, token: str
) -> None:
    app = boxctl(machine, "token", "create", "--name", "newsletter", "--app").stdout.strip()
    assert http(machine, "GET", "/api/tasks", app)[0] == 200
    listed = json.loads(boxctl(machine, "token", "ls", "--json").stdout)
    newsletter = [t for t in listed if t["name"] == "newsletter"]
    assert len(newsletter) == 1 and newsletter[0]["role"] == "app"
    assert all(app not in json.dumps(t) for t in listed)
    status, over_http = http(machine, "GET", "/api/tokens", token)
    assert status == 200 and over_http == listed
    assert "newsletter" in boxctl(machine, "token", "ls").stdout

    running = start_fake(machine, app, "step up\nsleep 60")
    wait_for_step(machine, running["id"])
    revoked = boxctl(machine, "token", "revoke", newsletter[0]["id"])
    assert revoked.stdout.strip() == f"revoked {newsletter[0]['id']} (newsletter)"
    expected = {"error": "a valid bearer token is required (boxctl token create)"}
    assert http(machine, "GET", "/api/tasks", app) == (401, expected)
    assert http(machine, "POST", f"/api/tasks/{running['id']}/stop", app) == (401, expected)
    # The owner revokes over HTTP as well; an unknown one is named.
    other = boxctl(machine, "token", "create", "--name", "spare", "--app").stdout.strip()
    status, gone = http(machine, "DELETE", "/api/tokens/spare", token)
    assert status == 200 and gone["name"] == "spare"
    assert http(machine, "GET", "/api/tasks", other)[0] == 401
    assert http(machine, "DELETE", "/api/tokens/spare", token) == (
        404,
        {"error": "no token spare (boxctl token ls lists them)"},
    )
    boxctl(machine, "stop", running["id"])
