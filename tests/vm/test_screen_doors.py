"""The owner in person (this computer's screen, a paired device) in a real box: settings, the
vault, pairing codes with their QR code, and removing a workspace. An owner's, an app's or a
member's token is refused each in the seed's words; the screen's session opens them as the header
the page sends it in, and as a cookie opens none; a paired device is let in and its changes take
effect."""

import json
from typing import Any

import segno

from boxd.web.screen_session import NO_TOKEN
from boxd.wire.caller import OWNER_ONLY
from testbed.box_api import API, BOXCTL, boxctl, http
from testbed.machine import Machine
from testbed.screen_login import session as screen_session
from tests.support.qr_modules import dark_modules

SECRET = "test.screen-doors"


def _device(machine: Machine, name: str) -> str:
    code = json.loads(boxctl(machine, "pair", name, "--json").stdout)["code"]
    status, paired = http(machine, "POST", "/api/pair", None, json.dumps({"code": code}))
    assert status == 201, paired
    return str(paired["token"])


def _as_cookie(
    machine: Machine, method: str, path: str, session: str, body: str | None
) -> tuple[int, Any]:
    argv = ["curl", "-sS", "-X", method, "-w", "\n%{http_code}", f"{API}{path}"]
    argv += ["-H", f"Cookie: boxd_screen={session}"]
    if body is not None:
        argv += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    done = machine.run(*argv, input=body)
    text, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(text) if text else None


def _routes() -> list[tuple[str, str, str | None]]:
    return [
        ("GET", "/api/settings", None),
        ("PATCH", "/api/settings", json.dumps({"defaultBudgetCents": 4321})),
        ("GET", "/api/vault", None),
        ("PUT", f"/api/vault/{SECRET}", json.dumps({"value": "stolen"})),
        ("DELETE", f"/api/vault/{SECRET}", None),
        ("POST", "/api/pairings", json.dumps({"name": "thief-phone"})),
        ("DELETE", "/api/workspaces/kept", None),
    ]


def test_no_token_but_a_device_s_reaches_the_owner_s_doors(
    machine: Machine, owner: str, token: str
) -> None:
    app = boxctl(machine, "token", "create", "--name", "doors-app", "--app").stdout.strip()
    member = boxctl(machine, "token", "create", "--member", "u-doors").stdout.strip()
    assert http(machine, "POST", "/api/workspaces", token, json.dumps({"name": "kept"}))[0] == 201
    machine.run(BOXCTL, "vault", "set", SECRET, input="kept")
    settings = boxctl(machine, "settings", "--json").stdout
    session = screen_session(machine, owner)
    for method, path, body in _routes():
        for refused in (token, app, member):
            assert http(machine, method, path, refused, body) == (403, {"error": OWNER_ONLY}), path
        refused_screen = _as_cookie(machine, method, path, session, body)
        assert refused_screen == (401, {"error": NO_TOKEN}), path
    # Nothing of that took effect.
    assert boxctl(machine, "settings", "--json").stdout == settings
    assert SECRET in boxctl(machine, "vault", "ls").stdout
    _, workspaces = http(machine, "GET", "/api/workspaces", token)
    assert "kept" in [w["name"] for w in workspaces]
    tokens = json.loads(boxctl(machine, "token", "ls", "--json").stdout)
    assert "thief-phone" not in [t["name"] for t in tokens]
    boxctl(machine, "vault", "rm", SECRET)
    assert http(machine, "DELETE", "/api/workspaces/kept", _device(machine, "cleaner"))[0] == 200


def test_a_paired_device_changes_settings_vault_and_workspaces(
    machine: Machine, token: str
) -> None:
    device = _device(machine, "owners-phone")
    status, settings = http(machine, "GET", "/api/settings", device)
    assert status == 200 and settings == json.loads(boxctl(machine, "settings", "--json").stdout)
    old = settings["defaultBudgetCents"]
    changed = json.dumps({"defaultBudgetCents": old + 7})
    status, now = http(machine, "PATCH", "/api/settings", device, changed)
    assert status == 200 and now == {**settings, "defaultBudgetCents": old + 7}
    shown = json.loads(boxctl(machine, "settings", "--json").stdout)
    assert shown["defaultBudgetCents"] == old + 7
    status, said = http(machine, "PATCH", "/api/settings", device, json.dumps({"nope": 1}))
    assert status == 400 and "nope" in said["error"]
    back = json.dumps({"defaultBudgetCents": old})
    assert http(machine, "PATCH", "/api/settings", device, back)[1]["defaultBudgetCents"] == old

    put = json.dumps({"value": "the device's secret"})
    assert http(machine, "PUT", f"/api/vault/{SECRET}", device, put) == (200, {"name": SECRET})
    status, names = http(machine, "GET", "/api/vault", device)
    assert status == 200 and {"name": SECRET, "belongsTo": "test"} in names
    assert "the device's secret" not in json.dumps(names)
    assert SECRET in boxctl(machine, "vault", "ls").stdout
    assert http(machine, "DELETE", f"/api/vault/{SECRET}", device) == (200, {"name": SECRET})
    assert http(machine, "DELETE", f"/api/vault/{SECRET}", device)[0] == 404
    status, said = http(machine, "PUT", "/api/vault/x", device, json.dumps({"value": 1}))
    assert status == 400 and "value" in said["error"]

    made = http(machine, "POST", "/api/workspaces", device, json.dumps({"name": "scratch"}))
    assert made[0] == 201
    status, removed = http(machine, "DELETE", "/api/workspaces/scratch", device)
    assert status == 200 and removed["name"] == "scratch", removed
    workspaces = http(machine, "GET", "/api/workspaces", token)[1]
    assert "scratch" not in [w["name"] for w in workspaces]


def test_the_screen_makes_a_pairing_code_with_its_qr_code(machine: Machine, owner: str) -> None:
    session = screen_session(machine, owner)
    body = json.dumps({"name": "screen-phone"})
    status, pairing = http(machine, "POST", "/api/pairings", session, body)
    assert status == 201, pairing
    assert pairing["device"] == "screen-phone" and pairing["expiresInSeconds"] == 600
    code = pairing["code"]
    assert pairing["qrSvg"].startswith("<svg")
    # The QR code is the code's text, as segno draws it for that text and nothing else.
    drawn = segno.make_qr(code, error="m")
    dark = {
        (x + 4, y + 4) for y, row in enumerate(drawn.matrix) for x, bit in enumerate(row) if bit
    }
    assert dark_modules(pairing["qrSvg"]) == dark
    # And the code pairs the device, once.
    status, paired = http(machine, "POST", "/api/pair", None, json.dumps({"code": code}))
    assert status == 201 and paired["device"] == "screen-phone"


def test_boxctl_pair_draws_the_qr_code_on_a_terminal_only(machine: Machine) -> None:
    on_terminal = machine.run("script", "-qec", f"{BOXCTL} pair tty-phone", "/dev/null").stdout
    assert "Pairing code for tty-phone: " in on_terminal and "█" in on_terminal
    code = on_terminal.split("Pairing code for tty-phone: ", 1)[1].split()[0]
    assert len(code) == 11 and code[5] == "-"
    piped = boxctl(machine, "pair", "pipe-phone").stdout
    assert "Pairing code for pipe-phone: " in piped and "█" not in piped
