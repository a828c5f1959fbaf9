"""This computer's own screen in a real box, as an attacker would try it: `boxctl open`'s link
used twice, or as a token; a forged or revoked session cookie; a change without the CSRF token
or from another origin; and no token can make a link. (A link's minute is in the unit tests,
with a clock of their own.)"""

import json
import re
from typing import Any

from boxd.caller import LINK_USED, SCREEN_SESSION_SECONDS
from boxd.web.screen_session import (
    CSRF_COOKIE,
    CSRF_HEADER,
    NO_CSRF,
    SESSION_COOKIE,
    SESSION_ENDED,
    csrf_token,
)
from tests.vm.box_api import API, boxctl, http
from tests.vm.machine import Machine

LINK = re.compile(r"^(http://127\.0\.0\.1:7700/login\?code=\S+)$", re.MULTILINE)


def _link(machine: Machine, owner: str) -> str:
    printed = boxctl(machine, "open", user=owner).stdout
    found = LINK.search(printed)
    assert found is not None, printed
    return found.group(1)


def _follow(machine: Machine, url: str) -> tuple[int, str, str]:
    """Status, headers and body of one GET, redirects not followed."""
    done = machine.run("curl", "-sS", "-D", "-", "-o", "/dev/stdout", url)
    head, _, body = done.stdout.replace("\r\n", "\n").partition("\n\n")
    status = int(head.split()[1])
    return status, head, body


def _with_cookie(
    machine: Machine, method: str, path: str, session: str, *headers: str, body: str | None = None
) -> tuple[int, Any]:
    argv = ["curl", "-sS", "-X", method, "-w", "\n%{http_code}", f"{API}{path}"]
    argv += ["-H", f"Cookie: {SESSION_COOKIE}={session}"]
    for header in headers:
        argv += ["-H", header]
    if body is not None:
        argv += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    done = machine.run(*argv, input=body)
    text, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(text) if text else None


def _cookies(head: str) -> dict[str, str]:
    return {
        line.split(":", 1)[1].strip().split("=", 1)[0]: line.split(":", 1)[1].strip()
        for line in head.splitlines()
        if line.lower().startswith("set-cookie:")
    }


def test_the_link_opens_one_session_with_a_strict_cookie(machine: Machine, owner: str) -> None:
    url = _link(machine, owner)
    status, head, _ = _follow(machine, url)
    assert status == 303 and "\nlocation: /" in head.lower()
    cookies = _cookies(head)
    flags = {part.strip().lower() for part in cookies[SESSION_COOKIE].split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/", f"max-age={SCREEN_SESSION_SECONDS}"} <= flags
    session = cookies[SESSION_COOKIE].split(";")[0].split("=", 1)[1]
    assert cookies[CSRF_COOKIE].split(";")[0] == f"{CSRF_COOKIE}={csrf_token(session)}"
    # Used twice: refused, and no second session.
    again, head, body = _follow(machine, url)
    assert again == 401 and json.loads(body) == {"error": LINK_USED}
    assert "set-cookie" not in head.lower()
    # The session is this computer's screen: it may do what the owner may.
    status, tasks = _with_cookie(machine, "GET", "/api/tasks", session)
    assert status == 200 and isinstance(tasks, list)
    assert _with_cookie(machine, "GET", "/api/approvals", session)[0] == 200


def test_a_change_needs_the_csrf_token_from_this_origin(machine: Machine, owner: str) -> None:
    _, head, _ = _follow(machine, _link(machine, owner))
    session = _cookies(head)[SESSION_COOKIE].split(";")[0].split("=", 1)[1]
    body = json.dumps({"name": "screens"})
    good = f"{CSRF_HEADER}: {csrf_token(session)}"
    refused = _with_cookie(machine, "POST", "/api/workspaces", session, body=body)
    assert refused == (403, {"error": NO_CSRF})
    wrong = _with_cookie(
        machine, "POST", "/api/workspaces", session, f"{CSRF_HEADER}: {'0' * 64}", body=body
    )
    assert wrong == (403, {"error": NO_CSRF})
    for foreign in (
        "Origin: http://evil.example",
        "Origin: http://127.0.0.1:8080",
        "Sec-Fetch-Site: same-site",
    ):
        status, said = _with_cookie(
            machine, "POST", "/api/workspaces", session, good, foreign, body=body
        )
        assert status == 403 and "this box's own address" in said["error"], foreign
    status, workspaces = _with_cookie(machine, "GET", "/api/workspaces", session)
    assert "screens" not in [w["name"] for w in workspaces]
    status, made = _with_cookie(
        machine,
        "POST",
        "/api/workspaces",
        session,
        good,
        "Origin: http://127.0.0.1:7700",
        "Sec-Fetch-Site: same-origin",
        body=body,
    )
    assert status == 201 and made["name"] == "screens"


def test_a_forged_or_revoked_session_is_refused(machine: Machine, owner: str) -> None:
    _, head, _ = _follow(machine, _link(machine, owner))
    session = _cookies(head)[SESSION_COOKIE].split(";")[0].split("=", 1)[1]
    assert _with_cookie(machine, "GET", "/api/tasks", session)[0] == 200
    forged = _with_cookie(machine, "GET", "/api/tasks", "boxscreen_forged")
    assert forged == (401, {"error": SESSION_ENDED})
    # Listed with the tokens, as the screen, made by the owner; revoked by id.
    tokens = json.loads(boxctl(machine, "token", "ls", "--json", user=owner).stdout)
    screens = [t for t in tokens if t["role"] == "screen" and t.get("createdBy") == owner]
    assert screens
    assert session not in json.dumps(tokens)
    for screen in screens:
        boxctl(machine, "token", "revoke", screen["id"], user=owner)
    assert _with_cookie(machine, "GET", "/api/tasks", session) == (401, {"error": SESSION_ENDED})


def test_a_session_past_its_hours_is_over_and_removed(machine: Machine, owner: str) -> None:
    _, head, _ = _follow(machine, _link(machine, owner))
    session = _cookies(head)[SESSION_COOKIE].split(";")[0].split("=", 1)[1]
    assert _with_cookie(machine, "GET", "/api/tasks", session)[0] == 200
    # The box's record, as if the session had been opened SCREEN_SESSION_SECONDS ago (the
    # clock of the machine is the host's, so it cannot be moved for one test).
    aged = (
        "import sqlite3, sys; db = sqlite3.connect('/var/lib/box/box.db'); "
        "db.execute(\"UPDATE tokens SET created = created - ? WHERE role = 'screen'\", "
        "(int(sys.argv[1]),)); db.commit()"
    )
    machine.run("python3", "-c", aged, str(SCREEN_SESSION_SECONDS))
    assert _with_cookie(machine, "GET", "/api/tasks", session) == (401, {"error": SESSION_ENDED})
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
    url = _link(machine, owner)
    code = url.partition("code=")[2]
    status, said = http(machine, "GET", "/api/tasks", code)
    assert status == 403, said
    assert _follow(machine, url)[0] == 303
