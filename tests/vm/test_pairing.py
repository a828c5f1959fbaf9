"""Paired devices, as a guesser, an app and the device itself would try them: a code pairs one
device, once; a device's tasks say phone:<its name>, and no one else's may; the device may do
what the owner may, until it is revoked. (A code's ten minutes are tested with a clock in
tests/manager/access/test_pairing.py: a test machine cannot wait them out.)"""

import json
from typing import Any

from boxd.wire.caller import OWNER_ONLY
from testbed.box_api import boxctl, finish, http, start_fake
from testbed.machine import Machine

WRONG = (
    "that pairing code is not one this box made: check it, or make a new one with boxctl pair NAME"
)
USED = (
    "that pairing code was used already: a code pairs one device, once; "
    "make a new one with boxctl pair NAME"
)


def _pair_code(machine: Machine, name: str) -> str:
    made = json.loads(boxctl(machine, "pair", name, "--json").stdout)
    assert made["device"] == name and made["expiresInSeconds"] == 600
    code = made["code"]
    assert isinstance(code, str)
    return code


def _exchange(machine: Machine, code: Any) -> tuple[int, Any]:
    return http(machine, "POST", "/api/pair", None, json.dumps({"code": code}))


def test_no_caller_but_a_paired_device_may_say_phone(machine: Machine, token: str) -> None:
    app = boxctl(machine, "token", "create", "--name", "liar", "--app").stdout.strip()
    member = boxctl(machine, "token", "create", "--member", "u-liar").stdout.strip()
    for sender in (token, app, member):
        for source in ("phone:bob", "PHONE:bob"):
            body = json.dumps(
                {"title": "x", "prompt": "step hi", "worker": "fake", "source": source}
            )
            status, said = http(machine, "POST", "/api/tasks", sender, body)
            assert status == 400, said
            assert said["error"].startswith(
                f"source {source} is refused: phone:<device name> is set by the box"
            )
    by_owner = boxctl(
        machine, "start", "--worker", "fake", "--source", "phone:bob", "step hi", check=False
    )
    assert by_owner.returncode == 1 and "is set by the box" in by_owner.stderr
    # Any other source goes through as sent.
    assert start_fake(machine, token, "step hi", source="jira:BOX-12")["source"] == "jira:BOX-12"


def test_pairing_codes_are_refused_in_plain_words_and_guessing_holds_up_no_one(
    machine: Machine, token: str
) -> None:
    assert _exchange(machine, "AAAAA-AAAAA") == (403, {"error": WRONG})
    status, said = http(machine, "POST", "/api/pair", None, json.dumps({"code": 7}))
    assert status == 400 and "code" in said["error"]
    status, said = http(machine, "POST", "/api/pair", None, json.dumps({"code": "x", "name": "y"}))
    assert status == 400 and "name" in said["error"]
    # Only the owner in person makes codes (polkit, the screen, a paired device): not a
    # token, not a stranger.
    on_gateway = machine.run(
        "busctl",
        "call",
        "org.boxd.Box1",
        "/org/boxd/Box1",
        "org.boxd.Box1.Gateway",
        "CreatePairing",
        "ss",
        token,
        "mine",
        user="nobody",
        check=False,
    )
    assert on_gateway.returncode != 0 and OWNER_ONLY in on_gateway.stderr, on_gateway.stderr
    stranger = machine.run(
        "busctl",
        "call",
        "org.boxd.Box1",
        "/org/boxd/Box1",
        "org.boxd.Box1.Manager",
        "CreatePairing",
        "s",
        "mine",
        user="nobody",
        check=False,
    )
    assert stranger.returncode != 0

    code = _pair_code(machine, "used-phone")
    status, paired = _exchange(machine, code.lower().replace("-", ""))
    assert status == 201 and paired["device"] == "used-phone"
    assert _exchange(machine, code) == (403, {"error": USED})

    # A stranger's wrong codes, over HTTP and on the bus, hold up no one: the owner still pairs.
    guessed = _pair_code(machine, "guessed-phone")
    for attempt in range(20):
        assert _exchange(machine, f"ZZZZZ-ZZZZ{attempt % 10}") == (403, {"error": WRONG})
    assert _exchange(machine, guessed)[0] == 201
    names = [t["name"] for t in json.loads(boxctl(machine, "token", "ls", "--json").stdout)]
    assert "guessed-phone" in names


def test_a_paired_device_acts_as_the_owner_until_revoked(machine: Machine, token: str) -> None:
    status, paired = _exchange(machine, _pair_code(machine, "anna-phone"))
    assert status == 201
    device = paired["token"]
    shown = start_fake(machine, device, "step from the phone", source="api")
    assert shown["source"] == "phone:anna-phone"
    lying = start_fake(machine, device, "step hi", source="phone:somebody-else")
    assert lying["source"] == "phone:anna-phone"
    assert finish(machine, shown["id"])["state"] == "done"
    # What the owner may: others' tasks, approvals, tokens, pause.
    owners = start_fake(machine, token, "step the owner's")
    assert http(machine, "GET", f"/api/tasks/{owners['id']}", device)[0] == 200
    assert http(machine, "GET", "/api/approvals", device)[0] == 200
    status, tokens = http(machine, "GET", "/api/tokens", device)
    mine = [t for t in tokens if t["name"] == "anna-phone"]
    assert status == 200 and len(mine) == 1 and mine[0]["role"] == "device"
    assert http(machine, "GET", "/api/pause", device) == (200, {"paused": False})
    revoked = boxctl(machine, "token", "revoke", "anna-phone")
    assert revoked.stdout.strip() == f"revoked {mine[0]['id']} (anna-phone)"
    expected = {"error": "a valid bearer token is required (boxctl token create)"}
    assert http(machine, "GET", "/api/tasks", device) == (401, expected)
