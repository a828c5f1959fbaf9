"""An approval approves one thing: a task that reuses a key for something else gets a 400, and
calls waiting for an OK keep their cost reserved. Played as the task, over its broker.sock."""

import json
import time
from typing import Any

from testbed.box_api import boxctl, http, start_fake
from testbed.broker_posts import post
from testbed.machine import Machine
from testbed.wallet_calls import short_approval_wait  # noqa: F401

TOOLS = ["wallet.pay", "wallet.balance", "echo.say"]


def pay(to: str, cents: int, key: str) -> dict[str, Any]:
    return {"tool": "wallet.pay", "input": {"to": to, "cents": cents}, "key": key}


def payments(machine: Machine, task_id: str) -> list[tuple[str, str, int]]:
    """The wallet's ledger for the task, as (key, payee, cents)."""
    script = (
        "import json, os, sqlite3, sys\n"
        "path = '/var/lib/box/apps/wallet/ledger.db'\n"
        "rows = []\n"
        "if os.path.exists(path):\n"  # no ledger yet: nobody was ever paid
        "    db = sqlite3.connect(f'file:{path}?mode=ro', uri=True)\n"
        "    rows = db.execute('SELECT key, payee, cents FROM bookings WHERE task = ?"
        " ORDER BY key', (sys.argv[1],)).fetchall()\n"
        "print(json.dumps(rows))\n"
    )
    done = machine.run("/usr/lib/boxd/venv/bin/python", "-c", script, task_id)
    return [(key, payee, cents) for key, payee, cents in json.loads(done.stdout)]


def approvals_of(machine: Machine, task_id: str) -> dict[str, dict[str, Any]]:
    listed = json.loads(boxctl(machine, "approvals", "--json").stdout)
    return {a["id"].split(".", 1)[1]: a for a in listed if a["task"] == task_id}


def running(machine: Machine, token: str, budget: int = 100) -> dict[str, Any]:
    task = start_fake(machine, token, "sleep 300", tools=TOOLS, budgetCents=budget)
    # The broker's socket is there once the task runs.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        shown = json.loads(boxctl(machine, "show", task["id"], "--json").stdout)
        if shown["state"] == "running":
            return task
        time.sleep(0.1)
    raise AssertionError(f"task {task['id']} did not start: {shown}")


def test_an_answered_question_never_pays(machine: Machine, token: str) -> None:
    task = running(machine, token)
    question = {"question": "May I read the news?", "key": "k"}
    assert post(machine, task, "/ask", question) == (200, {"pending": True})
    boxctl(machine, "approve", f"{task['id']}.k")
    assert post(machine, task, "/ask", question) == (200, {"approved": True})
    # The attack: the owner's yes to an innocent question is spent on a payment.
    assert post(machine, task, "/call", pay("Mallory", 100_000, "k")) == (
        400,
        {"error": "key k was used for a question (POST /ask); a call needs a key of its own"},
    )
    assert post(machine, task, "/ask", {**question, "question": "May I pay Mallory?"}) == (
        400,
        {"error": "key k was used for another question; a new question needs a new key"},
    )
    # A question still waiting for its answer is no call's approval either.
    assert post(machine, task, "/ask", {"question": "And the weather?", "key": "q"}) == (
        200,
        {"pending": True},
    )
    status, refused = post(machine, task, "/call", pay("Mallory", 100_000, "q"))
    assert (status, refused["error"]) == (
        400,
        "key q was used for a question (POST /ask); a call needs a key of its own",
    )
    boxctl(machine, "approve", f"{task['id']}.q")
    assert post(machine, task, "/call", pay("Mallory", 100_000, "q"))[0] == 400
    assert payments(machine, task["id"]) == []
    shown = json.loads(boxctl(machine, "show", task["id"], "--json").stdout)
    assert shown["costCents"] == 0
    boxctl(machine, "stop", task["id"])


def test_a_pending_call_key_never_runs_another_input(machine: Machine, token: str) -> None:
    task = running(machine, token)
    status, waiting = post(machine, task, "/call", pay("Ada", 500, "k"))
    assert (status, waiting["pending"]) == (200, True)
    other_input = (
        400,
        {
            "error": "key k was used for a call of wallet.pay with another input; "
            "a new call needs a new key"
        },
    )
    assert post(machine, task, "/call", pay("Mallory", 500, "k")) == other_input
    # The owner says yes to paying Ada; that yes pays Ada and nobody else.
    approval = approvals_of(machine, task["id"])["k"]
    boxctl(machine, "approve", approval["id"])
    assert post(machine, task, "/call", pay("Mallory", 500, "k")) == other_input
    assert payments(machine, task["id"]) == []
    # What the owner said yes to: the tool, its input's hash and its cost, and the input shown.
    assert (approval["tool"], approval["costCents"]) == ("wallet.pay", 500)
    assert len(approval["inputHash"]) == 64
    assert '"to": "Ada"' in approval["question"]
    assert post(machine, task, "/call", {**pay("Ada", 500, "k"), "tool": "echo.say"})[0] == 400
    assert post(machine, task, "/ask", {"question": "Pay Ada?", "key": "k"}) == (
        400,
        {"error": "key k was used for a call of wallet.pay; a question needs a key of its own"},
    )
    status, paid = post(machine, task, "/call", pay("Ada", 500, "k"))
    assert (status, paid["ok"]) == (200, True), paid
    assert payments(machine, task["id"]) == [("k", "Ada", 500)]
    boxctl(machine, "stop", task["id"])


def test_an_answered_key_names_its_call_for_good(machine: Machine, token: str) -> None:
    task = running(machine, token)
    said = {"tool": "echo.say", "input": {"text": "a"}, "key": "e"}
    assert post(machine, task, "/call", said) == (200, {"ok": True, "output": {"text": "a"}})
    # Same call, same key: the logged result, as the spec's key rules say.
    assert post(machine, task, "/call", said) == (200, {"ok": True, "output": {"text": "a"}})
    assert post(machine, task, "/call", {**said, "input": {"text": "b"}}) == (
        400,
        {
            "error": "key e was used for a call of echo.say with another input; "
            "a new call needs a new key"
        },
    )
    assert post(machine, task, "/ask", {"question": "Say b?", "key": "e"})[0] == 400
    assert approvals_of(machine, task["id"]) == {}
    boxctl(machine, "stop", task["id"])


def test_calls_waiting_for_an_ok_keep_their_cost_reserved(machine: Machine, token: str) -> None:
    task = running(machine, token, budget=100)
    assert post(machine, task, "/call", pay("Ada", 150, "a"))[1]["pending"] is True
    assert post(machine, task, "/call", pay("Bob", 150, "b"))[1]["pending"] is True
    waiting = approvals_of(machine, task["id"])
    assert "takes task" in waiting["b"]["question"]
    assert "to 300 cents" in waiting["b"]["question"], waiting["b"]
    # Within budget alone, but not with the 300 cents that wait for the owner.
    status, third = post(machine, task, "/call", pay("Cy", 10, "c"))
    assert (status, third.get("pending")) == (200, True), third
    assert "to 310 cents" in approvals_of(machine, task["id"])["c"]["question"]
    assert payments(machine, task["id"]) == []
    # The reservation is the record's, not the broker's memory.
    machine.run("systemctl", "kill", "--signal=KILL", f"box-broker@{task['id']}.service")
    status, fourth = post(machine, task, "/call", pay("Dee", 5, "d"))
    assert (status, fourth.get("pending")) == (200, True), fourth
    assert "to 315 cents" in approvals_of(machine, task["id"])["d"]["question"]
    # A denied call reserves nothing: with a, b and c denied, five cents fit again.
    for key in ("a", "b", "c"):
        boxctl(machine, "deny", f"{task['id']}.{key}")
    status, fifth = post(machine, task, "/call", pay("Eve", 5, "e"))
    assert (status, fifth.get("ok")) == (200, True), fifth
    assert payments(machine, task["id"]) == [("e", "Eve", 5)]
    _, listed = http(machine, "GET", "/api/approvals", token)
    assert [a["id"] for a in listed if a["task"] == task["id"]] == [f"{task['id']}.d"]
    boxctl(machine, "stop", task["id"])
