"""This computer's own screen in a real box, as an attacker would try it: `boxctl open`'s link
used twice, or as a token; a forged, revoked or logged-out session; the session sent as a cookie
(what another port of 127.0.0.1 could get the browser to send), with curl; and no token can make
a link. (A link's minute is in the unit tests, with a clock of their own.)"""

import json
from typing import Any

from boxd.web.screen_session import NO_TOKEN, SESSION_ENDED, SESSION_PATH
from boxd.wire.caller import LINK_USED, SCREEN_SESSION_SECONDS
from testbed.box_api import API, boxctl, http
from testbed.machine import Machine
from testbed.screen_login import _code, _trade, session


def _with_cookie(
    machine: Machine, method: str, path: str, cookie: str, body: str | None = None
) -> tuple[int, Any]:
    """What another port's page could get the browser to send: cookies, and the old header."""
    argv = ["curl", "-sS", "-X", method, "-w", "\n%{http_code}", f"{API}{path}"]
    argv += ["-H", f"Cookie: {cookie}", "-H", "X-CSRF-Token: x"]
    if body is not None:
        argv += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    done = machine.run(*argv, input=body)
    text, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(text) if text else None


def test_the_link_s_code_opens_one_session_and_sets_no_cookie(machine: Machine, owner: str) -> None:
    code = _code(machine, owner)
    status, head, answer = _trade(machine, code)
    assert status == 201 and answer["expiresInSeconds"] == SCREEN_SESSION_SECONDS, answer
    assert "set-cookie" not in head and "cache-control: no-store" in head
    # Used twice: refused, and no second session.
    again, head, said = _trade(machine, code)
    assert (again, said) == (401, {"error": LINK_USED})
    screens = [
        t
        for t in json.loads(boxctl(machine, "token", "ls", "--json", user=owner).stdout)
        if t["role"] == "screen"
    ]
    assert len(screens) >= 1 and answer["session"] not in json.dumps(screens)
    # The session is this computer's screen, sent as the header it is: it may do what the
    # owner may, the owner in person's doors too, with no CSRF token.
    status, tasks = http(machine, "GET", "/api/tasks", answer["session"])
    assert status == 200 and isinstance(tasks, list)
    status, made = http(
        machine, "POST", "/api/workspaces", answer["session"], json.dumps({"name": "screens"})
    )
    assert status == 201 and made["name"] == "screens"
    assert http(machine, "DELETE", "/api/workspaces/screens", answer["session"])[0] == 200


def test_the_session_as_a_cookie_opens_no_door(machine: Machine, owner: str) -> None:
    live = session(machine, owner)
    cookie = f"boxd_screen={live}; boxd_csrf=x"
    settings = boxctl(machine, "settings", "--json").stdout
    for method, path, body in (
        ("GET", "/api/tasks", None),
        ("GET", "/api/vault", None),
        ("GET", "/api/events", None),
        ("PATCH", "/api/settings", json.dumps({"modelBaseUrl": "http://127.0.0.1:8766"})),
        ("POST", "/api/pairings", json.dumps({"name": "thief-phone"})),
        ("POST", "/api/pause", None),
        ("DELETE", SESSION_PATH, None),
    ):
        assert _with_cookie(machine, method, path, cookie, body) == (
            401,
            {"error": NO_TOKEN},
        ), path
    assert boxctl(machine, "settings", "--json").stdout == settings
    tokens = json.loads(boxctl(machine, "token", "ls", "--json").stdout)
    assert "thief-phone" not in [t["name"] for t in tokens]
    assert http(machine, "GET", "/api/pause", live) == (200, {"paused": False})


def test_a_forged_revoked_or_logged_out_session_is_refused(machine: Machine, owner: str) -> None:
    revoked, logged_out = session(machine, owner), session(machine, owner)
    assert http(machine, "GET", "/api/tasks", revoked)[0] == 200
    assert http(machine, "GET", "/api/tasks", "boxscreen_forged") == (401, {"error": SESSION_ENDED})
    # Listed with the tokens, as the screen, made by the owner; revoked by id.
    tokens = json.loads(boxctl(machine, "token", "ls", "--json", user=owner).stdout)
    screens = [t for t in tokens if t["role"] == "screen" and t.get("createdBy") == owner]
    assert len(screens) >= 2
    assert revoked not in json.dumps(tokens) and logged_out not in json.dumps(tokens)
    mine = {t["id"] for t in screens}
    assert http(machine, "DELETE", SESSION_PATH, logged_out) == (200, {"ended": True})
    after = json.loads(boxctl(machine, "token", "ls", "--json", user=owner).stdout)
    # One screen fewer: the one that logged out, and no other.
    assert len(mine - {t["id"] for t in after}) == 1
    assert http(machine, "GET", "/api/tasks", logged_out) == (401, {"error": SESSION_ENDED})
    for screen in after:
        if screen["role"] == "screen":
            boxctl(machine, "token", "revoke", screen["id"], user=owner)
    assert http(machine, "GET", "/api/tasks", revoked) == (401, {"error": SESSION_ENDED})
    # Logging out is a screen's: an owner's token has no session to end.
    owner_token = boxctl(machine, "token", "create", "--name", "not-a-screen").stdout.strip()
    assert http(machine, "DELETE", SESSION_PATH, owner_token)[0] == 403


def test_a_session_past_its_hours_is_over_and_removed(machine: Machine, owner: str) -> None:
    live = session(machine, owner)
    assert http(machine, "GET", "/api/tasks", live)[0] == 200
    # The box's record, as if the session had been opened SCREEN_SESSION_SECONDS ago (the
    # clock of the machine is the host's, so it cannot be moved for one test).
    aged = (
        "import sqlite3, sys; db = sqlite3.connect('/var/lib/box/box.db'); "
        "db.execute(\"UPDATE tokens SET created = created - ? WHERE role = 'screen'\", "
        "(int(sys.argv[1]),)); db.commit()"
    )
    machine.run("python3", "-c", aged, str(SCREEN_SESSION_SECONDS))
    assert http(machine, "GET", "/api/tasks", live) == (401, {"error": SESSION_ENDED})
    tokens = json.loads(boxctl(machine, "token", "ls", "--json", user=owner).stdout)
    assert [t for t in tokens if t["role"] == "screen"] == []


def test_no_token_makes_a_link_and_a_link_is_no_token(
    machine: Machine, owner: str, token: str
) -> None:
    app = boxctl(machine, "token", "create", "--name", "linker", "--app").stdout.strip()
    for bearer in (app, token):
        made = machine.run(
            "busctl",
            "call",
            "org.boxd.Box1",
            "/org/boxd/Box1",
            "org.boxd.Box1.Gateway",
            "CreateScreenLink",
            "s",
            bearer,
            user="nobody",
            check=False,
        )
        assert made.returncode != 0
    stranger = machine.run(
        "busctl",
        "call",
        "org.boxd.Box1",
        "/org/boxd/Box1",
        "org.boxd.Box1.Manager",
        "CreateScreenLink",
        user="nobody",
        check=False,
    )
    assert stranger.returncode != 0 and "owner" in stranger.stderr
    # The link's code is good for opening a session and nothing else.
    code = _code(machine, owner)
    status, said = http(machine, "GET", "/api/tasks", code)
    assert status == 403, said
    assert _trade(machine, code)[0] == 201
