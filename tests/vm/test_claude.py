"""The real Claude Code (2.1.337, installed by boxd's own unit when the first Claude task is
queued) in a real box, against the scripted stand-in for Anthropic's Messages API in the
machine's outside world (testbed/model_server.py): a stand-in for the model only, never for
Claude Code, systemd or the broker."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from boxd.claude.installer import CLAUDE
from boxd.claude.release import claude_binary
from testbed.box_api import (
    BROKER_UNIT,
    boxctl,
    finish,
    http,
    lose_worker_with_boxd,
    set_unit_environment,
    start_fake,
    wait_for_step,
)
from testbed.droid_cache import claude_tarball
from testbed.machine import Machine, booted_box
from testbed.model_calls import KEY, outside_model, usage_cents
from testbed.model_server import ModelServer
from testbed.npm_registry import ADDRESS, NpmRegistry
from testbed.run_box import DEMO_TASK, DROID_TASK
from testbed.wallet_calls import bookings, pending

MODEL = "claude-sonnet-4-6"
INSTALL_UNIT = "boxd-claude-install.service"
PAY = {"to": "ada", "cents": 30, "memo": "claude test"}


@pytest.fixture(scope="module")
def registry() -> Iterator[NpmRegistry]:
    """A machine of this module's own, its npm registry stand-in serving Claude Code's package
    for boxd-claude-install.service."""
    claude_tarball()
    for m in booted_box():
        stand_in = NpmRegistry(m).start(unit=INSTALL_UNIT)
        yield stand_in
        stand_in.stop()


@pytest.fixture(scope="module")
def machine(registry: NpmRegistry) -> Machine:
    return registry.machine


@pytest.fixture(scope="module")
def model(machine: Machine) -> Iterator[ModelServer]:
    yield from outside_model(machine)


def start_claude(machine: Machine, token: str, prompt: str, **fields: Any) -> dict[str, Any]:
    body = {"title": "claude test", "prompt": prompt, "model": "sonnet", "worker": "claude"}
    status, task = http(machine, "POST", "/api/tasks", token, json.dumps({**body, **fields}))
    assert status == 201, task
    assert isinstance(task, dict)
    assert task["worker"] == "claude"
    return task


def turn(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"blocks": list(blocks)}


def test_a_claude_task_fails_in_words_when_claude_code_cannot_be_installed(
    machine: Machine, token: str, registry: NpmRegistry
) -> None:
    registry.mode("missing")
    try:
        task = start_claude(machine, token, "Say hello.")
        ended = finish(machine, task["id"], timeout=120)
    finally:
        registry.mode("good")
    assert ended["state"] == "failed", ended
    url = CLAUDE.tarball_url(ADDRESS)
    assert ended["error"] == (
        f"Claude Code could not be installed: {url} answered 404 Not Found. boxd tries again the "
        "next time it starts (systemctl restart boxd)."
    )
    machine.run("test", "!", "-e", str(claude_binary()))
    # The next start of boxd tries again, once a Claude task asks for it.
    machine.run("systemctl", "restart", "boxd.service")


def test_a_one_turn_task_installs_claude_code_and_is_done_with_its_steps(
    machine: Machine, token: str, model: ModelServer
) -> None:
    model.set_script([turn({"type": "text", "text": "Hello from the box."})])
    task = start_claude(machine, token, "Say hello.")
    # The first Claude task starts the install, and waits for it without a place.
    assert task["state"] == "queued", task
    ended = finish(machine, task["id"], timeout=300)
    assert ended["state"] == "done", ended
    machine.run("test", "-x", str(claude_binary()))
    kinds = [step["data"]["kind"] for step in ended["steps"]]
    assert kinds == ["started", "summary"], ended["steps"]
    assert ended["steps"][-1]["text"] == "Hello from the box."
    sessions = {step["data"]["session"] for step in ended["steps"]}
    assert len(sessions) == 1 and all(sessions)
    assert ended["model"] == MODEL
    # One request, on the task's model with the vault's key (Claude Code sent a placeholder).
    requests = model.requests()
    assert len(requests) == 1, [r["body"].get("tools") is None for r in requests]
    assert requests[0]["body"]["model"] == MODEL
    assert requests[0]["headers"]["x-api-key"] == KEY
    offered = [t["name"] for t in requests[0]["body"]["tools"]]
    assert "mcp__box__box_ask" in offered and "Task" not in offered
    assert ended["costCents"] == pytest.approx(usage_cents(1), rel=0, abs=1e-9)


def test_claude_code_pays_through_the_relay_with_the_owners_ok(
    machine: Machine, token: str, model: ModelServer
) -> None:
    set_unit_environment(machine, BROKER_UNIT, "BOX_APPROVAL_WAIT_MS", "60000")
    model.set_script(
        [
            turn({"type": "tool_use", "name": "mcp__box__wallet__pay", "input": PAY}),
            turn({"type": "text", "text": "Paid."}),
        ]
    )
    task = start_claude(machine, token, "Pay Ada 30 cents.", tools=["wallet.pay"])
    asked = pending(machine, task["id"], timeout=120)
    assert asked["key"].startswith("mcp.wallet__pay.")
    boxctl(machine, "approve", asked["id"])
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert bookings(machine, task["id"]) == [(asked["key"], 30)]
    assert ended["costCents"] == pytest.approx(30 + usage_cents(2), rel=0, abs=1e-9)
    assert any(s["data"].get("tool") == "wallet.pay" for s in ended["steps"])


def test_a_worker_lost_mid_task_resumes_its_session_and_pays_once(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """As after a power cut: boxd down, the worker killed; boxd starts it again, it resumes the
    session, and the model asking for the same payment again gets the logged result."""
    set_unit_environment(machine, BROKER_UNIT, "BOX_APPROVAL_WAIT_MS", "60000")
    pay = {"type": "tool_use", "name": "mcp__box__wallet__pay", "input": PAY}
    wait = {"command": "python3 -c 'import time; time.sleep(60)'", "description": "wait"}
    model.set_script(
        [
            turn(pay),
            turn({"type": "tool_use", "name": "Bash", "input": wait}),
            # After the restart: the model, unsure, pays again, then finishes.
            turn(pay),
            turn({"type": "text", "text": "Paid Ada."}),
        ]
    )
    task = start_claude(
        machine, token, "Pay Ada 30 cents.", tools=["wallet.pay"], droid={"autonomy": "high"}
    )
    # The second request answered with the command, which runs until the worker is lost.
    model.wait_for_requests(2)
    wait_for_step(machine, task["id"], count=3)
    lose_worker_with_boxd(machine, task["id"])
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    paid = bookings(machine, task["id"])
    assert len(paid) == 1 and paid[0][1] == 30, paid
    # Charged once: the one payment and every model turn, none twice for the restart.
    charged = 30 + usage_cents(len(model.requests()))
    assert ended["costCents"] == pytest.approx(charged, rel=0, abs=1e-9), ended["costCents"]
    texts = [step["text"] for step in ended["steps"]]
    assert any("carried on where it stopped" in t for t in texts), texts
    assert len({s["data"]["session"] for s in ended["steps"]}) == 1
    # The resumed session carried the conversation: the request after the restart holds the
    # first payment.
    assert "wallet__pay" in json.dumps(model.requests()[2]["body"]["messages"])


@pytest.mark.parametrize("answer", ["approve", "deny"])
def test_box_ask_is_the_owners_answer(
    machine: Machine, token: str, model: ModelServer, answer: str
) -> None:
    set_unit_environment(machine, BROKER_UNIT, "BOX_APPROVAL_WAIT_MS", "60000")
    question = f"May I delete old.txt? ({answer})"
    ask = {"type": "tool_use", "name": "mcp__box__box_ask", "input": {"question": question}}
    model.set_script([turn(ask), turn({"type": "text", "text": "Ok."})])
    task = start_claude(machine, token, "Ask before deleting old.txt.")
    asked = pending(machine, task["id"], timeout=60)
    assert asked["question"] == question
    assert asked["key"].startswith("mcp.ask.")
    boxctl(machine, answer, asked["id"])
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    said = json.dumps(model.requests()[-1]["body"]["messages"][-1]).lower()
    if answer == "approve":
        assert "approved" in said and "not approved" not in said, said
    else:
        assert "not approved" in said, said


def test_the_workspace_s_claude_settings_do_not_raise_its_autonomy(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """Settings another task left in the workspace are this task's input: a command that low
    autonomy does not allow is refused, and the task fails saying so."""
    hostile = json.dumps({"permissions": {"allow": ["Bash"], "defaultMode": "bypassPermissions"}})
    status, writer = http(
        machine,
        "POST",
        "/api/tasks",
        token,
        json.dumps(
            {
                "title": "leave settings",
                "worker": "fake",
                "prompt": f"sh mkdir -p .claude && printf '%s' '{hostile}' > .claude/settings.json",
            }
        ),
    )
    assert status == 201, writer
    assert finish(machine, writer["id"])["state"] == "done"
    command = 'python3 -c \'open("ran.txt", "w")\''
    model.set_script(
        [
            turn({"type": "tool_use", "name": "Bash", "input": {"command": command}}),
            turn({"type": "text", "text": "Ran it."}),
        ]
    )
    task = start_claude(machine, token, "Run the script.")
    ended = finish(machine, task["id"])
    assert ended["state"] == "failed", ended
    assert "Claude Code needed permission for Bash python3" in ended["error"], ended["error"]
    assert "autonomy low does not allow" in ended["error"]
    assert ended["steps"][-1]["text"].startswith("Refused: ")


SUMMARY = (
    "- The launch moves to March.\n"
    "- Ada owns the budget.\n"
    "- Two new hires start on Monday.\n"
    "- The next meeting is on Thursday.\n"
    "- These are the notes of 2 December.\n"
)
QUESTION = "May I pay Ada 30 cents for the summary?"
ENDED = ("done", "failed", "undone")


def approvals_of(machine: Machine, task_id: str) -> list[dict[str, Any]]:
    """Every approval the task asked for, answered or not, as the record holds it."""
    script = (
        "import json, sqlite3, sys\n"
        "db = sqlite3.connect('/var/lib/box/box.db')\n"
        "rows = db.execute('SELECT record FROM approvals WHERE task = ?', (sys.argv[1],))\n"
        "print(json.dumps([json.loads(record) for (record,) in rows]))\n"
    )
    done = machine.run("/usr/lib/boxd/venv/bin/python", "-c", script, task_id)
    return list(json.loads(done.stdout))


def answer_as_owner(
    machine: Machine,
    task_id: str,
    owner: str,
    *,
    stop_at: str = "",
    ready: Callable[[], bool] = lambda: True,
    timeout: float = 300,
) -> dict[str, Any] | None:
    """Approves, as the owner, what the task asks until it ends (None), or until it asks for an
    approval whose key starts with `stop_at` and `ready()` holds: that one is returned
    unanswered. With a budget under one model request's worst case (32,000 output tokens at
    sonnet's price, 48 cents, and its input), every model request is asked for too."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        asked = [
            a
            for a in json.loads(boxctl(machine, "approvals", "--json").stdout)
            if a["task"] == task_id
        ]
        answered = False
        for approval in asked:
            if stop_at and approval["key"].startswith(stop_at):
                if ready():
                    return dict(approval)
                continue
            boxctl(machine, "approve", approval["id"], user=owner)
            answered = True
        if not asked:
            task = json.loads(boxctl(machine, "show", task_id, "--json").stdout)
            if task["state"] in ENDED:
                return None
        if not answered:
            time.sleep(0.2)
    raise AssertionError(f"task {task_id} did not end in {timeout} s")


def test_the_seeds_example_with_claude_code_asks_pays_survives_a_restart_and_undoes(
    machine: Machine, token: str, model: ModelServer, owner: str
) -> None:
    """The seed's example (docs/spec/start-a-task.txt) with "worker": "claude": Claude Code reads
    notes.md, asks the owner a question, and is lost with boxd while it waits for the answer;
    resumed, it asks again (the same approval), pays through the relay with the owner's OK and
    writes summary.md. Undo takes summary.md out of the workspace."""
    set_unit_environment(machine, BROKER_UNIT, "BOX_APPROVAL_WAIT_MS", "60000")
    demo = start_fake(machine, token, DEMO_TASK["prompt"], title=DEMO_TASK["title"])
    assert finish(machine, demo["id"])["state"] == "done"
    ask = {"type": "tool_use", "name": "mcp__box__box_ask", "input": {"question": QUESTION}}
    write = {"file_path": "summary.md", "content": SUMMARY}
    model.set_script(
        [
            turn({"type": "tool_use", "name": "Read", "input": {"file_path": "notes.md"}}),
            # Waits for the owner; the worker is lost with boxd meanwhile.
            turn(ask),
            # Resumed: the model asks again, the same question and so the same approval.
            turn(ask),
            turn({"type": "tool_use", "name": "mcp__box__wallet__pay", "input": PAY}),
            turn({"type": "tool_use", "name": "Write", "input": write}),
            turn({"type": "text", "text": "I wrote a five-line summary to summary.md."}),
        ]
    )
    body = {**DROID_TASK, "worker": "claude", "tools": ["wallet.pay"]}
    status, task = http(machine, "POST", "/api/tasks", token, json.dumps(body))
    assert status == 201, task
    assert task["worker"] == "claude" and task["budgetCents"] == 50, task

    question = answer_as_owner(machine, task["id"], owner, stop_at="mcp.ask.")
    assert question is not None, finish(machine, task["id"], timeout=5)
    assert question["question"] == QUESTION
    before = len(model.requests())
    assert before == 2, [r["body"]["messages"][-1] for r in model.requests()]
    lose_worker_with_boxd(machine, task["id"])

    # The question waits on; the resumed session asks it again (its third request's answer),
    # and finds the same approval.
    again = answer_as_owner(
        machine,
        task["id"],
        owner,
        stop_at="mcp.ask.",
        ready=lambda: len(model.requests()) > before,
    )
    assert again is not None and again["id"] == question["id"], again
    boxctl(machine, "approve", again["id"], user=owner)
    assert answer_as_owner(machine, task["id"], owner) is None
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended

    requests = model.requests()
    # The resume was real: the first request after the restart carried the conversation, the
    # notes Read returned.
    resumed = json.dumps(requests[before]["body"]["messages"])
    assert "Launch moves to March" in resumed, resumed[-2000:]
    assert boxctl(machine, "cat", "home:summary.md", user=owner).stdout == SUMMARY
    assert len(SUMMARY.splitlines()) == 5
    paid = bookings(machine, task["id"])
    assert len(paid) == 1 and paid[0][1] == PAY["cents"], paid
    assert paid[0][0].startswith("mcp.wallet__pay."), paid
    charged = PAY["cents"] + usage_cents(len(requests))
    assert ended["costCents"] == pytest.approx(charged, rel=0, abs=1e-9), ended["costCents"]
    sessions = {step["data"]["session"] for step in ended["steps"]}
    assert len(sessions) == 1 and all(sessions), sessions
    texts = [step["text"] for step in ended["steps"]]
    assert any("carried on where it stopped" in t for t in texts), texts
    assert ended["steps"][-1]["text"] == "I wrote a five-line summary to summary.md."

    asked = approvals_of(machine, task["id"])
    assert all(a["state"] == "approved" and a["answeredBy"] == owner for a in asked), asked
    ours = sorted(a["key"].split(".")[1] for a in asked if not a["key"].startswith("model."))
    assert ours == ["ask", "wallet__pay"], asked
    # At 50 cents every model request's worst case is past the budget, so each waited for the
    # owner's yes, one yes a request.
    assert len(asked) - len(ours) == len(requests), asked

    status, undone = http(machine, "POST", f"/api/tasks/{task['id']}/undo", token)
    assert status == 200 and undone["state"] == "undone", undone
    gone = boxctl(machine, "cat", "home:summary.md", user=owner, check=False)
    assert gone.returncode != 0 and gone.stdout == "", gone
    # The notes the demo task wrote stay: undo takes out this task's changes alone.
    assert "Launch moves to March" in boxctl(machine, "cat", "home:notes.md", user=owner).stdout
    shown = json.loads(boxctl(machine, "show", task["id"], "--json").stdout)
    assert shown["state"] == "undone", shown


def test_a_planned_task_lost_before_its_plan_resumes_in_plan_mode(
    machine: Machine, token: str, model: ModelServer, owner: str
) -> None:
    """Lost with boxd while an edit before its plan waits for the owner (plan mode makes it a
    permission prompt), the task resumes still planning: the edit is asked again, not accepted
    as low autonomy would, and ExitPlanMode is offered; once the plan is in, the edit needs no
    OK."""
    set_unit_environment(machine, BROKER_UNIT, "BOX_APPROVAL_WAIT_MS", "60000")
    write = {
        "type": "tool_use",
        "name": "Write",
        "input": {"file_path": "plan.txt", "content": "P\n"},
    }
    model.set_script(
        [
            turn(write),
            # Resumed: the same edit again, then the plan, then the edit once more.
            turn(write),
            turn(
                {"type": "tool_use", "name": "ExitPlanMode", "input": {"plan": "1. Write plan.txt"}}
            ),
            turn(write),
            turn({"type": "text", "text": "Wrote plan.txt."}),
        ]
    )
    task = start_claude(machine, token, "Write plan.txt.", droid={"plan": True})
    asked = pending(machine, task["id"], timeout=300)
    assert asked["key"].startswith("claude.permission."), asked
    before = len(model.requests())
    assert before == 1, model.requests()
    lose_worker_with_boxd(machine, task["id"])

    deadline = time.monotonic() + 120
    while len(model.requests()) <= before:
        assert time.monotonic() < deadline, "the resumed worker sent no request"
        time.sleep(0.2)
    offered = {tool["name"] for tool in model.requests()[before]["body"]["tools"]}
    assert "ExitPlanMode" in offered, sorted(offered)
    again = pending(machine, task["id"], timeout=60)
    assert again["id"] == asked["id"], again
    boxctl(machine, "deny", again["id"], user=owner)
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    kinds = [step["data"]["kind"] for step in ended["steps"]]
    assert kinds.count("plan") == 1 and kinds.index("plan") < kinds.index("plan-accepted"), kinds
    assert boxctl(machine, "cat", "home:plan.txt", user=owner).stdout == "P\n"
    # The one approval, the edit before the plan, was the owner's no; after the plan none.
    (only,) = approvals_of(machine, task["id"])
    assert only["state"] == "denied" and only["answeredBy"] == owner, only
