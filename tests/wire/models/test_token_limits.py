"""The owner's limits on an app's or a member's token (boxd.wire.models.token_limits), as such a
token's holder would try to get past them: a budget, tool, host or workspace over what it was made
with; a host rule wider than the allowed one; numbers that are not whole; limits that cannot be
read."""

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from boxd.cli.show import token_table
from boxd.errors import BoxError, Problem
from boxd.manager.access.tokens import TokenRecord
from boxd.manager.box import allowed_for
from boxd.manager.record.store import Store
from boxd.wire.caller import Caller, Role
from boxd.wire.models.owner_requests import NewToken
from boxd.wire.models.settings import NetworkDefault, Settings
from boxd.wire.models.task_request import TaskRequest
from boxd.wire.models.token_limits import DEFAULT, TokenLimits, check_task, parse_limits, within

WHO = "this member's token"


def _request(**fields: Any) -> TaskRequest:
    return TaskRequest.model_validate({"title": "t", "prompt": "p", **fields})


def _check(limits: TokenLimits, **fields: Any) -> tuple[int, list[str]]:
    return check_task(limits, WHO, _request(**fields), default_budget=100, default_hosts=[])


def _refused(limits: TokenLimits, **fields: Any) -> str:
    with pytest.raises(BoxError) as refused:
        _check(limits, **fields)
    assert refused.value.problem == Problem.FORBIDDEN
    return refused.value.message


def test_a_token_made_without_limits_gets_the_safe_ones() -> None:
    assert parse_limits("") == parse_limits("{}") == DEFAULT
    assert DEFAULT.model_dump() == {
        "maxBudgetCents": None,
        "tools": [],
        "hosts": [],
        "workspaces": ["home"],
    }
    assert _check(DEFAULT) == (100, [])
    assert _check(DEFAULT, budgetCents=100) == (100, [])
    assert _refused(DEFAULT, budgetCents=101) == (
        "this member's token allows a budget of at most 100 cents, not 101"
    )
    assert _refused(DEFAULT, budgetCents=100000) == (
        "this member's token allows a budget of at most 100 cents, not 100000"
    )
    assert _refused(DEFAULT, tools=["wallet.pay"]) == (
        "this member's token allows no tools, and this task asks for wallet.pay"
    )
    assert _refused(DEFAULT, hosts=["example.com"]) == (
        "this member's token allows no hosts, and this task asks for example.com"
    )
    assert _refused(DEFAULT, workspace="notes") == (
        "this member's token allows only the workspaces home, and this task asks for "
        "workspace notes"
    )


def test_within_its_limits_a_task_gets_what_it_asks_for() -> None:
    limits = parse_limits(
        json.dumps(
            {
                "maxBudgetCents": 500,
                "tools": ["echo.say", "mail.send"],
                "hosts": ["example.com:443", "*.shop.example", "93.184.216.34"],
                "workspaces": ["notes", "home"],
            }
        )
    )
    asked = {
        "budgetCents": 500,
        "tools": ["mail.send"],
        "hosts": ["EXAMPLE.com:443", "a.b.shop.example", "*.x.shop.example", "93.184.216.34:80"],
        "workspace": "notes",
    }
    budget, hosts = _check(limits, **asked)
    assert budget == 500
    assert hosts == ["example.com:443", "a.b.shop.example", "*.x.shop.example", "93.184.216.34:80"]
    assert _refused(limits, budgetCents=501) == (
        "this member's token allows a budget of at most 500 cents, not 501"
    )
    assert _refused(limits, tools=["echo.say", "wallet.pay"]) == (
        "this member's token allows only the tools echo.say, mail.send, and this task asks "
        "for wallet.pay"
    )
    assert _refused(limits, workspace="other") == (
        "this member's token allows only the workspaces notes, home, and this task asks for "
        "workspace other"
    )


@pytest.mark.parametrize(
    ("allowed", "wanted", "covered"),
    [
        ("example.com", "example.com", True),
        ("example.com", "example.com:8080", True),
        ("example.com", "example.com.", True),
        ("example.com:443", "example.com:443", True),
        # Any port is wider than one.
        ("example.com:443", "example.com", False),
        ("example.com:443", "example.com:8443", False),
        # A wildcard is every subdomain, and never the name itself.
        ("example.com", "*.example.com", False),
        ("example.com", "a.example.com", False),
        ("*.example.com", "a.example.com", True),
        ("*.example.com", "a.b.example.com:22", True),
        ("*.example.com", "*.a.example.com", True),
        ("*.example.com", "*.example.com", True),
        ("*.example.com", "example.com", False),
        ("*.example.com", "badexample.com", False),
        ("*.example.com", "*.badexample.com", False),
        ("*.example.com:443", "a.example.com", False),
        ("*.example.com:443", "*.example.com:443", True),
        ("a.example.com", "*.a.example.com", False),
        # An address is reached only by a rule that names it; a name never stands for one.
        ("93.184.216.34", "93.184.216.34:443", True),
        ("93.184.216.34:443", "93.184.216.34", False),
        ("example.com", "93.184.216.34", False),
        ("[2001:db8::1]", "[2001:db8::1]:443", True),
        ("[2001:db8::1]:443", "[2001:db8::2]:443", False),
    ],
)
def test_a_host_is_within_a_rule_only_where_every_place_it_reaches_is(
    allowed: str, wanted: str, covered: bool
) -> None:
    assert within([allowed], wanted) is covered
    limits = TokenLimits(hosts=[allowed])
    if covered:
        assert _check(limits, hosts=[wanted])[1] == [wanted.lower()]
    else:
        assert _refused(limits, hosts=[wanted]).endswith(
            f"asks for {wanted}, which they do not cover"
        )


def test_no_hosts_named_gets_the_owners_defaults_as_far_as_the_token_allows() -> None:
    limits = TokenLimits(hosts=["*.example.com", "api.shop.example:443"])
    request = _request()
    defaults = ["a.example.com", "example.com", "api.shop.example", "api.shop.example:443"]
    allowed = check_task(limits, WHO, request, default_budget=100, default_hosts=defaults)
    assert allowed == (100, ["a.example.com", "api.shop.example:443"])


def test_a_token_below_the_default_budget_gives_its_own_to_a_task_that_names_none() -> None:
    limits = TokenLimits(maxBudgetCents=30)
    assert _check(limits) == (30, [])
    # Null follows the box's default as it is when the task is made.
    assert check_task(DEFAULT, WHO, _request(), default_budget=250, default_hosts=[])[0] == 250


def test_autonomy_and_the_worker_widen_nothing() -> None:
    for droid in ({"autonomy": "high"}, {"autonomy": "medium", "plan": True}, {}):
        assert _refused(DEFAULT, droid=droid, hosts=["example.com"]).endswith("example.com")
        assert _refused(DEFAULT, droid=droid, budgetCents=5000).endswith("not 5000")
    assert _refused(DEFAULT, worker="fake", tools=["wallet.pay"]).endswith("wallet.pay")


def test_shared_files_go_to_the_tasks_own_new_workspace() -> None:
    files = [{"name": "notes.md", "content": "aGk="}]
    assert _check(TokenLimits(workspaces=[]), files=files) == (100, [])


@pytest.mark.parametrize(
    ("sent", "words"),
    [
        ('{"maxBudgetCents": 1e400}', "maxBudgetCents: 1e400 is not a finite number"),
        ('{"maxBudgetCents": 50.0}', "maxBudgetCents must be a whole number from 0 to 100000"),
        ('{"maxBudgetCents": -0.0}', "maxBudgetCents must be a whole number from 0 to 100000"),
        ('{"maxBudgetCents": -1}', "maxBudgetCents must be a whole number from 0 to 100000"),
        ('{"maxBudgetCents": 100001}', "maxBudgetCents must be a whole number from 0 to 100000"),
        ('{"maxBudgetCents": true}', "maxBudgetCents must be a whole number from 0 to 100000"),
        ('{"maxBudgetCents": "5"}', "maxBudgetCents must be a whole number from 0 to 100000"),
        ('{"tools": "wallet.pay"}', "tools must be a list of names"),
        ('{"tools": [""]}', "tools: a name is 1 to 200 characters"),
        ('{"tools": [1]}', "tools must be a list of names"),
        ('{"hosts": ["localhost"]}', "hosts: 'localhost' is the box itself"),
        ('{"hosts": ["*"]}', "hosts: '*' is not a host"),
        ('{"workspaces": null}', "workspaces must be a list of names"),
        ('{"root": true}', "unknown field root"),
        ("[]", "the body must be a JSON object"),
        ("null", "the body must be a JSON object"),
        ('{"tools": [], "tools": ["wallet.pay"]}', "tools is given twice"),
    ],
)
def test_limits_that_are_not_plain_are_refused_in_words(sent: str, words: str) -> None:
    with pytest.raises(BoxError) as refused:
        parse_limits(sent)
    assert refused.value.problem == Problem.INVALID
    assert words in refused.value.message


def test_minus_zero_is_a_budget_of_nothing() -> None:
    assert parse_limits('{"maxBudgetCents": -0}').maxBudgetCents == 0
    assert _refused(TokenLimits(maxBudgetCents=0), budgetCents=1).endswith("at most 0 cents, not 1")
    assert _check(TokenLimits(maxBudgetCents=0)) == (0, [])


def test_a_token_from_before_limits_or_whose_limits_cannot_be_read_gets_the_defaults() -> None:
    old = TokenRecord("a" * 64, "u-1", "member", 0.0, "root")
    assert old.limits == DEFAULT
    assert old.public()["limits"] == DEFAULT.model_dump(mode="json")
    damaged = TokenRecord("b" * 64, "shop", "app", 0.0, "root", '{"maxBudgetCents": "lots"}')
    assert damaged.limits == DEFAULT
    made = TokenRecord(
        "c" * 64, "shop", "app", 0.0, "root", TokenLimits(tools=["echo.say"]).model_dump_json()
    )
    assert made.limits == TokenLimits(tools=["echo.say"])
    for role in ("owner", "device", "screen"):
        record = TokenRecord("d" * 64, "x", role, 0.0, "root", '{"tools": ["wallet.pay"]}')
        assert record.limits is None and "limits" not in record.public()


async def test_a_database_from_before_limits_opens_and_its_tokens_get_the_defaults(
    tmp_path: Path,
) -> None:
    path = tmp_path / "box.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE tokens (hash TEXT PRIMARY KEY, name TEXT NOT NULL, role TEXT NOT NULL, "
            "created REAL NOT NULL, user TEXT)"
        )
        db.execute("INSERT INTO tokens VALUES ('h1', 'u-old', 'member', 1.0, 'root')")
    db.close()
    store = Store(path)
    await store.open()
    found = await store.token("h1")
    assert found is not None and found.limits == DEFAULT
    await store.add_token(
        "h2", "shop", "app", "root", TokenLimits(maxBudgetCents=5).model_dump_json()
    )
    again = await store.token("h2")
    assert again is not None and again.limits == TokenLimits(maxBudgetCents=5)
    await store.close()


SETTINGS = Settings(
    defaultBudgetCents=100, defaultHosts=["example.com"], networkDefault=NetworkDefault.ALLOWLIST
)


def test_the_owner_is_held_to_no_token_limits() -> None:
    asked = _request(budgetCents=100000, tools=["wallet.pay"], workspace="files-t1")
    for role in (Role.OWNER, Role.SCREEN, Role.DEVICE):
        assert allowed_for(Caller(role, "o"), asked, SETTINGS) == (100000, ["example.com"])


def test_every_other_caller_is_held_to_its_tokens_limits_or_the_defaults() -> None:
    for role in (Role.APP, Role.MEMBER):
        # A caller with no limits at all (none should reach here) gets the defaults.
        caller = Caller(role, "x")
        assert allowed_for(caller, _request(), SETTINGS) == (100, [])
        with pytest.raises(BoxError) as refused:
            allowed_for(caller, _request(budgetCents=101), SETTINGS)
        assert refused.value.message.startswith(f"this {role}'s token allows a budget")
        wide = Caller(role, "x", limits=TokenLimits(workspaces=["files-t1", "home"]))
        with pytest.raises(BoxError) as refused:
            allowed_for(wide, _request(workspace="files-t1"), SETTINGS)
        assert refused.value.problem == Problem.FORBIDDEN
        assert refused.value.message == (
            "workspace files-t1 holds the files shared to task t1: only the owner may start "
            "another task on it"
        )


def test_the_screens_form_sends_limits_only_as_named() -> None:
    body = NewToken.model_validate_json(
        '{"name": "shop", "role": "app", "limits": {"maxBudgetCents": 5}}'
    )
    assert json.loads(body.limits_json()) == {"maxBudgetCents": 5}
    assert NewToken.model_validate_json('{"name": "me", "role": "owner"}').limits_json() == ""


def test_boxctl_token_ls_shows_each_tokens_limits() -> None:
    made = {"id": "0123456789ab", "role": "member", "createdAt": 0.0, "createdBy": "root"}
    shown = token_table(
        [
            {**made, "name": "u-anna", "limits": DEFAULT.model_dump(mode="json")},
            {
                **made,
                "name": "shop",
                "role": "app",
                "limits": {
                    "maxBudgetCents": 500,
                    "tools": ["echo.say"],
                    "hosts": ["example.com:443", "*.shop.example"],
                    "workspaces": ["notes"],
                },
            },
            {**made, "name": "laptop", "role": "owner"},
        ]
    ).splitlines()
    assert shown[2].strip() == (
        "limits: budget at most Settings defaultBudgetCents; no tools; no hosts; workspaces home"
    )
    assert shown[4].strip() == (
        "limits: budget at most 500 cents; tools echo.say; "
        "hosts example.com:443, *.shop.example; workspaces notes"
    )
    assert len(shown) == 6 and shown[5].endswith("laptop")
