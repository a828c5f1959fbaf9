"""The real Droid (0.225.2, installed by boxd's own unit) in a real box, against a scripted
stand-in for Anthropic's Messages API in the machine's outside world (testbed/model_server.py):
a stand-in for the model only, never for Droid, systemd or the broker. Each test scripts the
model's turns, Droid acts on them inside the task's sandbox, and the box's broker meters,
asks and pays."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from boxd.droid.release import droid_binary
from boxd.wire.model_key import KEY_REFUSED
from testbed.box_api import (
    BROKER_UNIT,
    boxctl,
    finish,
    http,
    lose_worker_with_boxd,
    set_unit_environment,
    wait_for_step,
)
from testbed.machine import Machine, booted_box
from testbed.model_calls import KEY, outside_model, usage_cents
from testbed.model_server import DEFAULT_USAGE, ModelServer
from testbed.npm_registry import NpmRegistry, droid_state, install_droid, restart_boxd
from testbed.outside_world import arrived
from testbed.wallet_calls import bookings, pending

MODEL = "claude-sonnet-4-6"
PAY = {"to": "ada", "cents": 30, "memo": "droid test"}


@pytest.fixture(scope="module")
def machine() -> Iterator[Machine]:
    """A machine of this module's own, with Droid installed, a key in the vault, and the model
    upstream pointed at the scripted server."""
    for m in booted_box():
        install_droid(m)
        yield m


@pytest.fixture(scope="module")
def model(machine: Machine) -> Iterator[ModelServer]:
    yield from outside_model(machine)


def approval_wait(machine: Machine, ms: int) -> None:
    """How long the next tasks' brokers wait for the owner before answering `pending`."""
    set_unit_environment(machine, BROKER_UNIT, "BOX_APPROVAL_WAIT_MS", str(ms))


def start_droid(machine: Machine, token: str, prompt: str, **fields: Any) -> dict[str, Any]:
    body = {"title": "droid test", "prompt": prompt, "model": "sonnet", **fields}
    status, task = http(machine, "POST", "/api/tasks", token, json.dumps(body))
    assert status == 201, task
    assert isinstance(task, dict)
    assert task["state"] == "running", task
    return task


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool(name: str, given: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": given}


def turn(*blocks: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"blocks": list(blocks), **more}


def execute(command: str) -> dict[str, Any]:
    return tool(
        "Execute",
        {
            "summary": "Run the step the test needs",
            "command": command,
            "riskLevelReason": "It only reads and writes scratch files in the workspace.",
            "riskLevel": "low",
        },
    )


def load(name: str) -> dict[str, Any]:
    """Droid defers MCP tools behind its ToolSearch tool: the model loads one first."""
    return turn(tool("ToolSearch", {"query": f"select:box___{name}"}))


def tool_results(request: dict[str, Any]) -> list[str]:
    """What the tools answered, as Droid sent it back to the model in this request."""
    found = []
    for message in request["body"]["messages"]:
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_result":
                inner = block.get("content")
                if isinstance(inner, list):
                    inner = " ".join(part.get("text", "") for part in inner)
                found.append(str(inner))
    return found


def shown(machine: Machine, task_id: str) -> dict[str, Any]:
    task = json.loads(boxctl(machine, "show", task_id, "--json").stdout)
    assert isinstance(task, dict)
    return task


def next_task_sees(machine: Machine, token: str, command: str) -> str:
    """What a shell command prints in the home workspace, run by the next (fake) task."""
    status, task = http(
        machine,
        "POST",
        "/api/tasks",
        token,
        json.dumps({"title": "look", "worker": "fake", "prompt": f"sh {command}"}),
    )
    assert status == 201, task
    assert isinstance(task, dict)
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    return str(ended["steps"][-1]["text"])


def test_droid_edits_a_file_and_is_done_with_its_steps(
    machine: Machine, token: str, model: ModelServer
) -> None:
    model.set_script(
        [
            turn(tool("Create", {"file_path": "summary.md", "content": "Five lines.\n"})),
            turn(text("I wrote summary.md.")),
        ]
    )
    task = start_droid(machine, token, "Write a five-line summary to summary.md.")
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    kinds = [step["data"]["kind"] for step in ended["steps"]]
    assert kinds == ["started", "tool", "summary"], ended["steps"]
    assert ended["steps"][-1]["text"] == "I wrote summary.md."
    sessions = {step["data"]["session"] for step in ended["steps"]}
    assert len(sessions) == 1
    assert ended["model"] == MODEL
    # Every request ran on the task's model with the vault's key, however Droid named them.
    requests = model.requests()
    assert len(requests) == 2
    assert {r["body"]["model"] for r in requests} == {MODEL}
    assert {r["headers"]["x-api-key"] for r in requests} == {KEY}
    # Driven over JSON-RPC, Droid offers the model its AskUser (the owner answers), and the
    # box's own box_ask, deferred behind ToolSearch with the task's other tools; not its
    # subagents, whose work would outlive the turn.
    offered = [t["name"] for t in requests[0]["body"]["tools"]]
    assert "AskUser" in offered
    assert "Task" not in offered
    assert "box___box_ask" in json.dumps(requests[0]["body"])
    # Usage metered exactly, and nothing else charged.
    assert ended["costCents"] == pytest.approx(usage_cents(2), rel=0, abs=1e-9)
    # What Droid made is there for the next task, and the group's to change, as every task's
    # files are (Droid itself makes them 0600).
    assert next_task_sees(machine, token, "cat summary.md; stat -c %a summary.md") == (
        "Five lines.\n660"
    )


def test_droid_pays_through_the_wallet_with_the_owners_ok(
    machine: Machine, token: str, model: ModelServer
) -> None:
    approval_wait(machine, 60_000)
    model.set_script(
        [load("wallet__pay"), turn(tool("box___wallet__pay", PAY)), turn(text("Paid."))]
    )
    task = start_droid(machine, token, "Pay Ada 30 cents.", tools=["wallet.pay"])
    asked = pending(machine, task["id"], timeout=60)
    assert asked["key"].startswith("mcp.wallet__pay.")
    assert "30" in asked["question"]
    boxctl(machine, "approve", asked["id"])
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert bookings(machine, task["id"]) == [(asked["key"], 30)]
    assert ended["costCents"] == pytest.approx(30 + usage_cents(3), rel=0, abs=1e-9)
    assert any(s["data"].get("tool") == "wallet.pay" for s in ended["steps"])


@pytest.mark.parametrize("answer", ["approve", "deny"])
def test_box_ask_is_the_owners_answer(
    machine: Machine, token: str, model: ModelServer, answer: str
) -> None:
    approval_wait(machine, 60_000)
    question = f"May I delete old.txt? ({answer})"
    model.set_script(
        [load("box_ask"), turn(tool("box___box_ask", {"question": question})), turn(text("Ok."))]
    )
    task = start_droid(machine, token, "Ask before deleting old.txt.")
    asked = pending(machine, task["id"], timeout=60)
    assert asked["question"] == question
    assert asked["key"].startswith("mcp.ask.")
    assert shown(machine, task["id"])["state"] == "waiting"
    boxctl(machine, answer, asked["id"])
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    said = tool_results(model.requests()[-1])[-1]
    if answer == "approve":
        assert "approved" in said.lower() and "not approved" not in said.lower(), said
    else:
        assert "not approved" in said.lower(), said


def test_pending_comes_back_as_text_and_asking_again_pays_once(
    machine: Machine, token: str, model: ModelServer
) -> None:
    # The owner approves while the model's second call waits: a wait long enough for a slow
    # `boxctl approve` on a busy machine, and a third identical call in case the second one came
    # back pending all the same (it is answered from the record then: still paid once).
    approval_wait(machine, 5000)
    model.set_script(
        [
            load("wallet__pay"),
            turn(tool("box___wallet__pay", PAY)),
            turn(tool("box___wallet__pay", PAY)),
            turn(tool("box___wallet__pay", PAY)),
            turn(text("Paid at last.")),
        ]
    )
    # A budget with room for each model request's worst case (32,000 output tokens, some 57
    # cents) beside the 30 cents paid: at the default 100, the request after the payment asks.
    task = start_droid(machine, token, "Pay Ada 30 cents.", tools=["wallet.pay"], budgetCents=200)
    asked = pending(machine, task["id"], timeout=60)
    # The first call's pending answer reaches the model as plain text, not an error...
    model.wait_for_requests(3)
    said = tool_results(model.requests()[2])[-1]
    assert "Waiting for the box owner" in said, said
    # ...and the model's second, identical call waits on the same approval, paid once.
    boxctl(machine, "approve", asked["id"])
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert bookings(machine, task["id"]) == [(asked["key"], 30)]
    assert [a for a in json.loads(boxctl(machine, "approvals", "--json").stdout)] == []


QUESTIONNAIRE = "1. [question] May I delete old.txt?\n[topic] Delete\n[option] Yes\n[option] No\n"


@pytest.mark.parametrize("answer", ["approve", "deny"])
def test_droids_own_question_is_the_owners_answer(
    machine: Machine, token: str, model: ModelServer, answer: str
) -> None:
    approval_wait(machine, 1500)
    model.set_script(
        [
            turn(text("I must ask first."), tool("AskUser", {"questionnaire": QUESTIONNAIRE})),
            turn(text("Ok.")),
        ]
    )
    task = start_droid(machine, token, f"Ask before deleting old.txt. ({answer})")
    asked = pending(machine, task["id"], timeout=60)
    assert asked["question"] == "Droid asks: May I delete old.txt? (Droid suggested: Yes / No)"
    assert asked["key"].startswith("droid.ask.")
    assert shown(machine, task["id"])["state"] == "waiting"
    # Past BOX_APPROVAL_WAIT_MS (1.5 s here) the broker answers pending and the worker asks
    # again with the same key: still this one approval, and Droid still waiting on it.
    wait_for_step(machine, task["id"], count=3)
    assert len(model.requests()) == 1
    boxctl(machine, answer, asked["id"])
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    said = tool_results(model.requests()[-1])[-1]
    word = "Yes: the box owner approved." if answer == "approve" else "No: the box owner did not"
    assert word in said, said
    assert [s["data"]["kind"] for s in ended["steps"]] == ["started", "message", "tool", "summary"]


def test_a_command_beyond_the_autonomy_is_refused_and_the_task_fails(
    machine: Machine, token: str, model: ModelServer
) -> None:
    risky = tool(
        "Execute",
        {
            "summary": "Remove the old files now",
            "command": "rm -f old.txt; echo ran > ran.txt",
            "riskLevelReason": "It deletes files irreversibly.",
            "riskLevel": "high",
        },
    )
    model.set_script([turn(risky), turn(text("Removed."))])
    task = start_droid(machine, token, "Remove old.txt.")
    ended = finish(machine, task["id"])
    assert ended["state"] == "failed", ended
    assert "needed permission for Execute rm -f old.txt" in ended["error"], ended
    assert "--auto low" in ended["error"]
    assert ended["steps"][-1]["text"].startswith("Refused: ")
    assert next_task_sees(machine, token, "ls ran.txt 2>&1; true").endswith(
        "No such file or directory"
    )


@pytest.mark.parametrize("answer", ["approve", "deny"])
def test_the_owner_is_asked_before_a_model_request_past_the_budget(
    machine: Machine, token: str, model: ModelServer, answer: str
) -> None:
    approval_wait(machine, 60_000)
    # 100,000 output tokens of Sonnet are 150 cents. (A huge input count would make Droid
    # compact its conversation, which is a model request of its own.)
    dear = {**DEFAULT_USAGE, "output_tokens": 100_000}
    first = tool("Create", {"file_path": "notes.md", "content": "thought\n"})
    model.set_script([turn(first, usage=dear), turn(text("Done."))])
    # The first reply takes the task past its budget, so Droid's second request waits.
    task = start_droid(machine, token, "Think, then finish.", budgetCents=100)
    asked = pending(machine, task["id"], timeout=60)
    assert asked["key"].startswith("model.")
    assert len(model.requests()) == 1
    boxctl(machine, answer, asked["id"])
    ended = finish(machine, task["id"])
    if answer == "approve":
        assert ended["state"] == "done", ended
        assert len(model.requests()) == 2
        assert ended["costCents"] == pytest.approx(
            usage_cents(1, dear) + usage_cents(1), rel=0, abs=1e-9
        )
    else:
        # Never forwarded, and the task says why in the gateway's words, not Droid's.
        assert ended["state"] == "failed", ended
        assert len(model.requests()) == 1
        assert "The box owner did not approve more spending on the model" in ended["error"]
        assert ended["costCents"] == pytest.approx(usage_cents(1, dear), rel=0, abs=1e-9)


def test_the_key_is_nowhere_the_worker_can_read(
    machine: Machine, token: str, model: ModelServer
) -> None:
    look = (
        "{ env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline | tr '\\0' '\\n'; "
        'cat "$HOME"/.factory/*.json; ls -laR "$HOME"; cat "$HOME"/.factory/logs/*; } '
        "> seen.txt 2>&1; true"
    )
    model.set_script([turn(execute(look)), turn(text("Looked."))])
    task = start_droid(machine, token, "Look around.", droid={"autonomy": "high"})
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    seen = next_task_sees(machine, token, "cat seen.txt")
    assert "BOX_SOCKET" in seen  # it did look
    assert KEY not in seen
    journal = machine.run("journalctl", "--no-pager", "-o", "verbose", "-b").stdout
    assert KEY not in journal
    # The key did reach the model, from the broker.
    assert {r["headers"]["x-api-key"] for r in model.requests()} == {KEY}


def test_an_upstream_401_ends_the_task_in_the_seeds_words(
    machine: Machine, token: str, model: ModelServer
) -> None:
    model.set_script([turn(status=401, error="invalid x-api-key")])
    task = start_droid(machine, token, "Anything.")
    ended = finish(machine, task["id"])
    assert ended["state"] == "failed", ended
    assert ended["error"] == KEY_REFUSED


def test_low_autonomy_reaches_the_model_and_no_host(
    machine: Machine, token: str, model: ModelServer
) -> None:
    model.set_script(
        [
            turn(execute("curl -sS -m 10 http://allowed.test/from-droid > fetched.txt 2>&1; true")),
            turn(text("Tried.")),
        ]
    )
    task = start_droid(machine, token, "Fetch it.", hosts=["allowed.test"])
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert "/from-droid" not in arrived(machine)
    assert len(model.requests()) == 2


def test_a_worker_lost_mid_task_carries_on_its_session_and_pays_once(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """As after a power cut: boxd down, the worker killed; boxd starts it again, it loads the
    newest session, and the model asking for the same payment again gets the logged result."""
    approval_wait(machine, 60_000)
    model.set_script(
        [
            load("wallet__pay"),
            turn(tool("box___wallet__pay", PAY)),
            turn(execute("sleep 60")),
            # After the restart: the model, unsure, pays again, then finishes.
            turn(tool("box___wallet__pay", PAY)),
            turn(text("Paid Ada.")),
        ]
    )
    task = start_droid(
        machine,
        token,
        "Pay Ada 30 cents.",
        tools=["wallet.pay"],
        droid={"autonomy": "high"},
    )
    model.wait_for_requests(3)
    wait_for_step(machine, task["id"], count=3)
    lose_worker_with_boxd(machine, task["id"])
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    paid = bookings(machine, task["id"])
    assert len(paid) == 1 and paid[0][1] == 30, paid
    texts = [step["text"] for step in ended["steps"]]
    assert any("carried on where it stopped" in t for t in texts), texts
    sessions = [s["data"]["session"] for s in ended["steps"]]
    assert len(set(sessions)) == 1  # the same session, loaded again
    # The loaded session carried the conversation: the request after the restart holds the
    # first payment's result.
    after = model.requests()[3]
    assert any("ada" in r.lower() or "paid" in r.lower() for r in tool_results(after))


def test_a_droid_task_queued_while_droid_installs_runs_once_it_is_there(
    machine: Machine, token: str, model: ModelServer
) -> None:
    machine.run("rm", "-rf", str(droid_binary().parent))
    registry = NpmRegistry(machine).start(hold=True)
    try:
        restart_boxd(machine)
        registry.wait_until_held()
        model.set_script([turn(text("Here now."))])
        status, queued = http(
            machine, "POST", "/api/tasks", token, json.dumps({"title": "t", "prompt": "Go."})
        )
        assert status == 201 and queued["state"] == "queued", queued
        registry.release()
        ended = finish(machine, queued["id"])
    finally:
        registry.stop()
    assert ended["state"] == "done", ended
    assert ended["steps"][-1]["text"] == "Here now."
    assert droid_state(machine)["installed"] is True


def test_droid_writes_its_plan_first_when_asked(
    machine: Machine, token: str, model: ModelServer
) -> None:
    plan = "1. Read notes.md\n2. Write summary.md"
    model.set_script(
        [
            turn(tool("ExitSpecMode", {"title": "Summary", "plan": plan})),
            turn(tool("Create", {"file_path": "summary.md", "content": "Summary.\n"})),
            turn(text("Wrote it.")),
        ]
    )
    task = start_droid(machine, token, "Summarise.", droid={"plan": True, "autonomy": "low"})
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    plans = [s for s in ended["steps"] if s["data"]["kind"] == "plan"]
    assert [s["text"] for s in plans] == [f"Plan:\n{plan}"]
    # Droid started in spec mode: it offered the model its tool for handing in the plan.
    assert "ExitSpecMode" in [t["name"] for t in model.requests()[0]["body"]["tools"]]
