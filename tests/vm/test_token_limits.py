"""Member and app tokens carry the owner's limits (issue 32, point 8), as a member or an app
holding one would try them with curl: a budget, tools, hosts and a workspace past what the token
was made with are refused (403, in words that name the limit) where the task is created; within
them the task starts; `boxctl token ls` and the screen show each token's limits, and the screen
makes one with them (in Debian's headless Chromium)."""

import base64
import json
from typing import Any

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from boxd.wire.caller import OWNER_ONLY
from testbed.box_api import boxctl, finish, http, start_fake
from testbed.browser import screenshot
from testbed.machine import Machine
from testbed.screen_driver import _click, _one, _press, _text, screen, until  # noqa: F401

# How each kind of limited token is made, and how its refusals name it.
KINDS = {
    "member": (("--member", "u-mallory"), "this member's token"),
    "app": (("--name", "mallory-app", "--app"), "this app's token"),
}


def _default_budget(machine: Machine) -> int:
    settings = json.loads(boxctl(machine, "settings", "--json").stdout)
    budget = settings["defaultBudgetCents"]
    assert isinstance(budget, int)
    return budget


def _shared_files_workspace(machine: Machine, token: str) -> str:
    """The owner's task with a shared file: its workspace files-<id> holds the owner's file."""
    files = [{"name": "contract.md", "content": base64.b64encode(b"the owner's").decode()}]
    shared = start_fake(machine, token, "step read", title="the owner's files", files=files)
    assert finish(machine, shared["id"])["state"] == "done"
    workspace = shared["workspace"]
    assert isinstance(workspace, str) and workspace.startswith("files-")
    return workspace


def _try(machine: Machine, token: str, **fields: Any) -> tuple[int, Any]:
    body = {"title": "mallory's", "prompt": "step in", "worker": "fake", **fields}
    return http(machine, "POST", "/api/tasks", token, json.dumps(body))


@pytest.mark.parametrize("kind", KINDS)
def test_a_default_token_cannot_spend_call_reach_or_open_past_its_limits(
    machine: Machine, token: str, kind: str
) -> None:
    """A token made with no limits named gets the safe ones: a budget no higher than Settings
    defaultBudgetCents, no tools, no hosts, the workspace home."""
    made_with, holder = KINDS[kind]
    mallory = boxctl(machine, "token", "create", *made_with).stdout.strip()
    budget = _default_budget(machine)
    theirs = _shared_files_workspace(machine, token)
    attacks: dict[str, dict[str, Any]] = {
        "budget": {"budgetCents": 100000},
        "tool": {"tools": ["wallet.pay"]},
        "host": {"hosts": ["example.com"]},
        "workspace": {"workspace": theirs},
    }
    expected = {
        "budget": f"{holder} allows a budget of at most {budget} cents, not 100000",
        "tool": f"{holder} allows no tools, and this task asks for wallet.pay",
        "host": f"{holder} allows no hosts, and this task asks for example.com",
        "workspace": (
            f"workspace {theirs} holds the files shared to task {theirs.removeprefix('files-')}: "
            "only the owner may start another task on it"
        ),
    }
    before = {t["id"] for t in json.loads(boxctl(machine, "list", "--json").stdout)}
    answers = {name: _try(machine, mallory, **fields) for name, fields in attacks.items()}
    # The statuses alone first: on a box without limits every one is a 201, the task started.
    assert {name: status for name, (status, _) in answers.items()} == dict.fromkeys(attacks, 403)
    assert answers == {name: (403, {"error": words}) for name, words in expected.items()}
    # The same door on D-Bus, behind the HTTP API: a local process holding the token.
    body = json.dumps({"title": "t", "prompt": "step in", "worker": "fake", "budgetCents": 100000})
    on_the_bus = machine.run(
        *("busctl", "call", "org.boxd.Box1", "/org/boxd/Box1", "org.boxd.Box1.Gateway"),
        *("CreateTask", "ss", mallory, body),
        user="nobody",
        check=False,
    )
    assert on_the_bus.returncode != 0 and expected["budget"] in on_the_bus.stderr
    # Nothing of them was made.
    after = {t["id"] for t in json.loads(boxctl(machine, "list", "--json").stdout)}
    assert after == before
    # Within the limits the token works: the default budget, no tools or hosts, home.
    allowed = start_fake(machine, mallory, "step within", budgetCents=budget)
    assert allowed["workspace"] == "home" and allowed["budgetCents"] == budget
    assert finish(machine, allowed["id"])["state"] == "done"


def _workspace(machine: Machine, name: str) -> None:
    listed = json.loads(boxctl(machine, "workspace", "ls", "--json").stdout)
    if name not in [w["name"] for w in listed]:
        boxctl(machine, "workspace", "create", name)


@pytest.mark.parametrize("kind", KINDS)
def test_a_token_made_with_limits_starts_tasks_within_them_and_no_further(
    machine: Machine, token: str, kind: str
) -> None:
    made_with, holder = KINDS[kind]
    _workspace(machine, "limits-notes")
    limits = (
        *("--max-budget", "500", "--tool", "echo.say"),
        *("--host", "example.com:443", "--host", "*.shop.example"),
        *("--workspace", "limits-notes", "--workspace", "home"),
    )
    limited = boxctl(machine, "token", "create", *made_with, *limits).stdout.strip()
    within = {
        "budgetCents": 500,
        "tools": ["echo.say"],
        "hosts": ["example.com:443", "a.shop.example", "*.b.shop.example"],
        "workspace": "limits-notes",
    }
    task = start_fake(machine, limited, "step within", **within)
    assert {field: task[field] for field in within} == within
    assert finish(machine, task["id"])["state"] == "done"
    # A budget it does not name is the box's default, or the token's highest if that is lower.
    assert start_fake(machine, limited, "step default")["budgetCents"] == min(
        500, _default_budget(machine)
    )

    allowed_hosts = "only the hosts example.com:443, *.shop.example"
    past: dict[str, tuple[dict[str, Any], str]] = {
        "a cent more": (
            {"budgetCents": 501},
            f"{holder} allows a budget of at most 500 cents, not 501",
        ),
        "a tool it was not given": (
            {"tools": ["echo.say", "wallet.pay"]},
            f"{holder} allows only the tools echo.say, and this task asks for wallet.pay",
        ),
        "any port, not 443": (
            {"hosts": ["example.com"]},
            f"{holder} allows {allowed_hosts}, and this task asks for example.com, which they "
            "do not cover",
        ),
        "a wider wildcard": (
            {"hosts": ["*.example.com"]},
            f"{holder} allows {allowed_hosts}, and this task asks for *.example.com, which they "
            "do not cover",
        ),
        "the name under the wildcard": (
            {"hosts": ["shop.example:443"]},
            f"{holder} allows {allowed_hosts}, and this task asks for shop.example:443, which "
            "they do not cover",
        ),
        "Droid at high autonomy": (
            {"worker": "droid", "droid": {"autonomy": "high"}, "hosts": ["evil.example"]},
            f"{holder} allows {allowed_hosts}, and this task asks for evil.example, which they "
            "do not cover",
        ),
        # Refused before it is looked up: the token learns nothing of the owner's workspaces.
        "a workspace it was not given": (
            {"workspace": "limits-nowhere"},
            f"{holder} allows only the workspaces limits-notes, home, and this task asks for "
            "workspace limits-nowhere",
        ),
    }
    for name, (fields, words) in past.items():
        assert _try(machine, limited, **fields) == (403, {"error": words}), name

    listed = json.loads(boxctl(machine, "token", "ls", "--json").stdout)
    mine = [t for t in listed if t["name"] == KINDS[kind][0][1]]
    assert mine and mine[-1]["role"] == kind
    assert mine[-1]["limits"] == {
        "maxBudgetCents": 500,
        "tools": ["echo.say"],
        "hosts": ["example.com:443", "*.shop.example"],
        "workspaces": ["limits-notes", "home"],
    }
    assert (
        "limits: budget at most 500 cents; tools echo.say; hosts example.com:443, "
        "*.shop.example; workspaces limits-notes, home"
    ) in boxctl(machine, "token", "ls").stdout
    assert http(machine, "GET", "/api/tokens", token) == (200, listed)


def _made(machine: Machine, *args: str) -> Any:
    return boxctl(machine, "token", "create", *args, check=False)


def test_limits_are_checked_as_the_token_is_made(machine: Machine) -> None:
    for args, words in (
        (("--app", "--name", "x", "--tool", "nosuch.tool"), "no tool nosuch.tool"),
        (("--member", "u-x", "--workspace", "limits-nowhere"), "no workspace limits-nowhere"),
        (("--member", "u-x", "--workspace", "files-t0"), "workspace files-t0 is one the box"),
        (("--member", "u-x", "--host", "localhost"), "hosts: 'localhost' is the box itself"),
        (("--member", "u-x", "--max-budget", "100001"), "maxBudgetCents must be a whole"),
        (("--max-budget", "5"), "an owner's token acts as the owner, so it has no limits"),
    ):
        refused = _made(machine, *args)
        assert refused.returncode == 1 and words in refused.stderr, (args, refused.stderr)
    assert _made(machine, "--member", "u-x", "--max-budget", "1e400").returncode == 2
    # Straight on D-Bus, the limits are JSON the manager reads as strictly as a task's body.
    for sent, words in (
        ('{"maxBudgetCents": 1e400}', "maxBudgetCents: 1e400 is not a finite number"),
        ('{"maxBudgetCents": -0.0}', "maxBudgetCents must be a whole number"),
        ('{"tools": "wallet.pay"}', "tools must be a list of names"),
        ("[]", "the body must be a JSON object"),
    ):
        wrong = machine.run(
            "busctl",
            "call",
            "org.boxd.Box1",
            "/org/boxd/Box1",
            "org.boxd.Box1.Manager",
            "CreateToken",
            "sss",
            "u-garbage",
            "member",
            sent,
            check=False,
        )
        assert wrong.returncode != 0 and words in wrong.stderr, (sent, wrong.stderr)
    assert "u-garbage" not in boxctl(machine, "token", "ls").stdout


def test_no_token_makes_a_token_but_the_owner_in_person_does(machine: Machine, token: str) -> None:
    """Over HTTP an owner's token (a script's), an app's and a member's are refused; a paired
    device, the owner in person as the screen is, makes one with its limits."""
    app = boxctl(machine, "token", "create", "--name", "limits-maker", "--app").stdout.strip()
    member = boxctl(machine, "token", "create", "--member", "u-maker").stdout.strip()
    wider = json.dumps({"name": "mine now", "role": "owner"})
    for holder in (token, app, member):
        assert http(machine, "POST", "/api/tokens", holder, wider) == (403, {"error": OWNER_ONLY})
    assert "mine now" not in boxctl(machine, "token", "ls").stdout

    code = json.loads(boxctl(machine, "pair", "limits-phone", "--json").stdout)["code"]
    status, paired = http(machine, "POST", "/api/pair", None, json.dumps({"code": code}))
    assert status == 201, paired
    sent = {"name": "u-phoned", "role": "member", "limits": {"maxBudgetCents": 40}}
    status, made = http(machine, "POST", "/api/tokens", paired["token"], json.dumps(sent))
    assert status == 201 and made["token"].startswith("box_"), made
    assert _try(machine, made["token"], budgetCents=41) == (
        403,
        {"error": "this member's token allows a budget of at most 40 cents, not 41"},
    )
    listed = json.loads(boxctl(machine, "token", "ls", "--json").stdout)
    shown = [t["limits"] for t in listed if t["name"] == "u-phoned"]
    assert shown == [{"maxBudgetCents": 40, "tools": [], "hosts": [], "workspaces": ["home"]}]
    garbage = {"name": "u-garbage", "role": "member", "limits": {"maxBudgetCents": "lots"}}
    status, said = http(machine, "POST", "/api/tokens", paired["token"], json.dumps(garbage))
    assert (status, said) == (
        400,
        {"error": "maxBudgetCents must be a whole number from 0 to 100000"},
    )


def test_a_token_stored_before_limits_gets_the_defaults(machine: Machine, token: str) -> None:
    """A row as a boxd before limits left it (no limits stored) is held to the defaults, not to
    nothing: here a token made with wide limits, which are then taken out of its row."""
    made = ("--member", "u-from-before", "--max-budget", "100000", "--tool", "wallet.pay")
    old = boxctl(machine, "token", "create", *made).stdout.strip()
    assert _try(machine, old, budgetCents=100000, tools=["wallet.pay"])[0] == 201
    forget = (
        "import sqlite3\n"
        "db = sqlite3.connect('/var/lib/box/box.db', timeout=30)\n"
        "db.execute(\"UPDATE tokens SET limits = NULL WHERE name = 'u-from-before'\")\n"
        "db.commit()\n"
    )
    machine.run("/usr/lib/boxd/venv/bin/python", "-c", forget)
    budget = _default_budget(machine)
    assert _try(machine, old, budgetCents=100000) == (
        403,
        {"error": f"this member's token allows a budget of at most {budget} cents, not 100000"},
    )
    listed = json.loads(boxctl(machine, "token", "ls", "--json").stdout)
    shown = [t["limits"] for t in listed if t["name"] == "u-from-before"]
    assert shown == [{"maxBudgetCents": None, "tools": [], "hosts": [], "workspaces": ["home"]}]


def _limits_shown(driver: WebDriver, name: str) -> str:
    script = """
        const row = [...document.querySelectorAll('tr[data-token]')]
            .find((r) => r.cells[0].innerText.trim() === arguments[0]);
        return row ? row.querySelector('[data-limits]').innerText.trim() : '';
    """
    return str(driver.execute_script(script, name))


def _fill(driver: WebDriver, name: str, text: str) -> None:
    field = _one(driver, f"[name={name}]")
    field.clear()
    field.send_keys(text)


def test_the_screen_makes_a_token_with_limits_and_shows_them(
    machine: Machine,
    screen: WebDriver,  # noqa: F811
) -> None:
    _click(screen, 'a[href="#/settings"]')
    until(screen, lambda d: _text(d, "main h1") == "Settings")
    # Garbage in the form is the box's to refuse, in its words: nothing is made.
    _fill(screen, "token-name", "u-screen-garbage")
    _fill(screen, "token-budget", "1e400")
    _press(screen, "Make a token")
    refused = "maxBudgetCents must be a whole number from 0 to 100000"
    until(screen, lambda d: refused in _text(d, "#toasts"), "the refusal was not shown")
    assert "u-screen-garbage" not in boxctl(machine, "token", "ls").stdout

    _fill(screen, "token-name", "u-screen")
    _fill(screen, "token-budget", "250")
    _fill(screen, "token-tools", "echo.say")
    _fill(screen, "token-hosts", "example.com:443\n*.shop.example")
    _fill(screen, "token-workspaces", "home")
    _press(screen, "Make a token")
    made = until(screen, lambda d: _text(d, "[data-made-token]"), "no token shown")
    assert made.startswith("box_")
    shown = until(screen, lambda d: _limits_shown(d, "u-screen"), "no limits shown")
    assert shown == (
        "budget at most 250 cents; tools echo.say; hosts example.com:443, *.shop.example; "
        "workspaces home"
    )
    screenshot(screen, "token-limits")
    assert _try(machine, made, budgetCents=251) == (
        403,
        {"error": "this member's token allows a budget of at most 250 cents, not 251"},
    )
    task = start_fake(machine, made, "step from the screen's token", budgetCents=250)
    assert task["requester"] == "u-screen" and task["budgetCents"] == 250
    assert finish(machine, task["id"])["state"] == "done"
