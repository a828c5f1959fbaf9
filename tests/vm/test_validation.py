"""Every rule of docs/spec/start-a-task.txt, through the real gateway and manager, with its
words."""

import json
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.box_api import boxctl, busctl_call, http, start_fake
from testbed.machine import Machine

BASE = {"title": "t", "prompt": "step ok", "worker": "fake"}


def without(field: str) -> dict[str, Any]:
    return {k: v for k, v in BASE.items() if k != field}


CASES: list[tuple[str, dict[str, Any], str]] = [
    ("no title", without("title"), "title is missing"),
    ("no prompt", without("prompt"), "prompt is missing"),
    ("empty title", {**BASE, "title": ""}, "title is missing"),
    ("long title", {**BASE, "title": "x" * 201}, "title is over 200 characters"),
    ("long prompt", {**BASE, "prompt": "x" * 100_001}, "prompt is over 100,000 characters"),
    (
        "negative budget",
        {**BASE, "budgetCents": -1},
        "budgetCents must be a whole number from 0 to 100000",
    ),
    (
        "big budget",
        {**BASE, "budgetCents": 100_001},
        "budgetCents must be a whole number from 0 to 100000",
    ),
    (
        "fractional budget",
        {**BASE, "budgetCents": 2.5},
        "budgetCents must be a whole number from 0 to 100000",
    ),
    ("unknown field", {**BASE, "colour": "red"}, "unknown field colour"),
    (
        "unknown worker",
        {**BASE, "worker": "robot"},
        "unknown worker 'robot'; this box has droid, claude and fake",
    ),
    (
        "unknown model",
        {**BASE, "model": "gpt-5"},
        "model: unknown model 'gpt-5'; use haiku, sonnet, opus or a full id like claude-sonnet-4-6",
    ),
    ("unknown workspace", {**BASE, "workspace": "notes"}, "no workspace notes"),
    ("workspace path", {**BASE, "workspace": "../../etc"}, "no workspace ../../etc"),
    (
        "unknown tool",
        {**BASE, "tools": ["weather.now"]},
        "no tool weather.now: it is not installed on this box",
    ),
    (
        "too many hosts",
        {**BASE, "hosts": [f"h{i}.example.com" for i in range(51)]},
        "hosts has 51 names; at most 50 are allowed",
    ),
    (
        "localhost",
        {**BASE, "hosts": ["localhost"]},
        "hosts: 'localhost' is the box itself: tasks never reach localhost",
    ),
    (
        "loopback",
        {**BASE, "hosts": ["127.0.0.1"]},
        "hosts: '127.0.0.1' is a loopback address: tasks never reach the box itself",
    ),
    (
        "link-local",
        {**BASE, "hosts": ["169.254.169.254:80"]},
        "hosts: '169.254.169.254:80' is a link-local address",
    ),
    (
        "whole TLD",
        {**BASE, "hosts": ["*.com"]},
        "hosts: '*.com' is a whole top-level domain, not a host",
    ),
    (
        "not a host",
        {**BASE, "hosts": ["http://example.com/x"]},
        "hosts: 'http://example.com/x' is a URL or a path, not a host; "
        "give the name alone, like example.com",
    ),
]


@pytest.mark.parametrize(("case", "body", "error"), CASES, ids=[c[0] for c in CASES])
def test_http_refusals(
    machine: Machine, token: str, case: str, body: dict[str, Any], error: str
) -> None:
    assert http(machine, "POST", "/api/tasks", token, json.dumps(body)) == (400, {"error": error})


def test_dbus_callers_meet_the_same_rules(machine: Machine) -> None:
    for _, body, error in CASES[:12]:
        done = busctl_call(machine, "CreateTask", json.dumps(body), check=False)
        assert done.returncode != 0
        assert error in done.stderr


def test_not_json_and_too_big(machine: Machine, token: str) -> None:
    status, answer = http(machine, "POST", "/api/tasks", token, "{nope")
    assert status == 400 and answer["error"].startswith("the body is not valid JSON")
    assert http(machine, "POST", "/api/tasks", token, "[]") == (
        400,
        {"error": "the body must be a JSON object"},
    )
    too_big = json.dumps({**BASE, "prompt": "x" * (10 * 1024 * 1024)})
    assert http(machine, "POST", "/api/tasks", token, too_big) == (
        413,
        {"error": "the body is over 10 MB"},
    )


def test_unknown_task(machine: Machine, token: str) -> None:
    assert http(machine, "GET", "/api/tasks/tzzzzzzzzz", token) == (
        404,
        {"error": "no task tzzzzzzzzz"},
    )
    assert http(machine, "POST", "/api/tasks/nonsense/stop", token) == (
        404,
        {"error": "no task nonsense"},
    )


def test_hosts_and_model_are_recorded(machine: Machine, token: str) -> None:
    task = start_fake(
        machine,
        token,
        "step ok",
        hosts=["Example.com", "*.example.org", "api.example.net:8443"],
        model="opus",
        budgetCents=0,
        source="jira:BOX-12",
        seat="Credit analyst",
    )
    assert task["hosts"] == ["example.com", "*.example.org", "api.example.net:8443"]
    assert task["model"] == "claude-opus-4-6"
    assert task["budgetCents"] == 0
    assert task["source"] == "jira:BOX-12"
    assert task["seat"] == "Credit analyst"


@pytest.fixture
def settings(machine: Machine) -> Iterator[None]:
    yield
    for name, value in (
        ("defaultBudgetCents", "100"),
        ("defaultHosts", "[]"),
        ("networkDefault", "none"),
    ):
        boxctl(machine, "settings", "set", name, value)


def test_settings_apply_to_new_tasks(machine: Machine, token: str, settings: None) -> None:
    shown = json.loads(boxctl(machine, "settings", "--json").stdout)
    # The box-wide limits default from the machine's cores and memory.
    for name in ("allTasksMemoryMaxBytes", "allTasksTasksMax", "maxRunningTasks"):
        value = shown.pop(name)
        assert isinstance(value, int) and value > 0, name
    assert shown == {
        "defaultBudgetCents": 100,
        "defaultHosts": [],
        "networkDefault": "none",
        "agentFolders": [],
        "taskMemoryMaxBytes": 4 * 1024**3,
        "taskTasksMax": 1024,
        "taskCPUPercent": 200,
        "taskDiskQuotaBytes": None,
        "modelBaseUrl": "https://api.anthropic.com",
        "modelMaxTokens": 32_000,
    }
    boxctl(machine, "settings", "set", "defaultBudgetCents", "42")
    boxctl(machine, "settings", "set", "defaultHosts", '["example.com"]')
    task = start_fake(machine, token, "step ok")
    assert task["budgetCents"] == 42
    assert task["hosts"] == []  # networkDefault is still none
    boxctl(machine, "settings", "set", "networkDefault", "allowlist")
    task = start_fake(machine, token, "step ok")
    assert task["hosts"] == ["example.com"]
    assert start_fake(machine, token, "step ok", hosts=[])["hosts"] == []
    bad = boxctl(machine, "settings", "set", "defaultBudgetCents", "-3", check=False)
    assert bad.returncode == 1
    assert bad.stderr.strip() == (
        "boxctl: defaultBudgetCents must be a whole number from 0 to 100000"
    )
    assert json.loads(boxctl(machine, "settings", "--json").stdout)["defaultBudgetCents"] == 42
