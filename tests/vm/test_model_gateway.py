"""The model gateway in a real box: each task's broker serves Anthropic's Messages API on
127.0.0.1:3130 inside the task's namespace (box-model@.socket), adds the vault's key, and
forwards to the scripted model server in the test machine's outside world
(testbed/model_server.py, http://model.test:9090 as settings' modelBaseUrl). Tasks are fake
workers that speak to $BOX_MODEL_URL with curl, as Droid would."""

import json
import math
import shlex
import time
from collections.abc import Iterator

import pytest

from boxd.wire.model_key import KEY_REFUSED, NO_KEY
from boxd.wire.pricing import reservation_cents
from testbed.box_api import (
    boxctl,
    database_bytes,
    finish,
    http,
    start_fake,
    wait_for_step,
)
from testbed.machine import Machine, booted_box
from testbed.model_calls import (
    KEY,
    MODEL,
    USAGE,
    ask_model,
    cost_of,
    request,
    scripted_model,
    texts,
    wait_for_approval,
)
from testbed.model_server import BASE_URL, ModelServer
from testbed.npm_registry import install_droid
from testbed.outside_world import arrived

# A first reply dear enough to take a 5-cent budget past its end: 3,000,000 input tokens of
# Sonnet are 900 cents.
DEAR = {"input_tokens": 3_000_000, "output_tokens": 10}


@pytest.fixture(scope="module")
def model(machine: Machine) -> Iterator[ModelServer]:
    yield from scripted_model(machine)


def task_pids(machine: Machine, task_id: str) -> list[str]:
    """Every process of the task's worker unit."""
    script = (
        'pid=$(systemctl show -p MainPID --value "$0")\n'
        "cgroup=$(sed -n 's/^0:://p' \"/proc/$pid/cgroup\")\n"
        "root=$(findmnt -n -o TARGET -t cgroup2 | head -n 1)\n"
        'cat "$root$cgroup/cgroup.procs"\n'
    )
    return machine.run("sh", "-c", script, f"box-task-{task_id}.service").stdout.split()


def test_the_key_reaches_the_model_and_nothing_the_worker_can_read(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """The attacker: a worker that sends its own key and another model, then looks for the
    owner's key in its environment, its processes' /proc, its files and the journal."""
    model.set_script([{"blocks": [{"type": "text", "text": "Hello from the model."}]}])
    prompt = "\n".join(
        [
            ask_model(request()),
            "sh env | grep -E '^BOX_MODEL_URL=|API_KEY' || true",
            "sh cat /run/credentials/*/* /var/lib/box/vault/* 2>&1 | head -c 300; true",
            "sleep 120",
        ]
    )
    task = start_fake(machine, token, prompt, model="sonnet")
    task_id = task["id"]
    try:
        wait_for_step(machine, task_id, 4)
        shown = json.loads(boxctl(machine, "show", task_id, "--json").stdout)
        reply, environment, credentials = texts(shown)[1:4]
        assert "Hello from the model." in reply and reply.endswith("status 200"), reply
        assert "event: message_stop" in reply
        assert environment == "BOX_MODEL_URL=http://127.0.0.1:3130"
        assert "No such file or directory" in credentials and KEY not in credentials

        (sent,) = model.requests()
        assert sent["headers"]["x-api-key"] == KEY
        assert "authorization" not in sent["headers"]
        assert sent["body"] == {**request(), "model": MODEL}

        # Everything of the worker's that root can see, while it runs.
        pids = task_pids(machine, task_id)
        assert pids
        for pid in pids:
            for part in ("environ", "cmdline"):
                seen = machine.run("cat", f"/proc/{pid}/{part}", check=False).stdout
                assert KEY not in seen, f"/proc/{pid}/{part}"
        found = machine.run(
            "sh",
            "-c",
            f"grep -rlsF -- {shlex.quote(KEY)} /var/lib/box/tasks/{task_id} "
            f"/tmp/systemd-private-*-box-task-{task_id}.service-* /var/lib/box/workspaces; true",
        ).stdout
        assert found == ""
        journal = machine.run("journalctl", "-b", "-o", "verbose", "--no-pager").stdout
        assert f"box-broker@{task_id}.service" in journal
        assert KEY not in journal
        assert KEY not in database_bytes(machine)
    finally:
        http(machine, "POST", f"/api/tasks/{task_id}/stop", token)


def test_usage_is_metered_exactly_into_the_tasks_cost(
    machine: Machine, token: str, model: ModelServer
) -> None:
    plain = {**USAGE, "output_tokens": 7}
    model.set_script([{"usage": USAGE}, {"usage": plain}])
    prompt = "\n".join([ask_model(request()), ask_model(request("again", stream=False))])
    task = finish(machine, start_fake(machine, token, prompt, model="sonnet")["id"])
    assert task["state"] == "done", task
    assert len(model.requests()) == 2
    # Summed from message_start's part and the rest, for the streamed reply.
    assert task["costCents"] == pytest.approx(cost_of(USAGE, plain), rel=0, abs=1e-9)
    story = machine.run(
        "journalctl", f"BOX_TASK={task['id']}", "BOX_EVENT=cost", "-o", "cat", "--no-pager"
    ).stdout
    # The streamed reply's two (what message_start said, as soon as it passed; the rest at
    # its end) and the other's one.
    assert story.count("\n") == 3, story


def test_a_broker_killed_mid_reply_has_logged_what_message_start_said_at_once(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """The input and cache tokens, most of what a reply costs, are on record as soon as the
    reply's message_start has passed: a broker killed before the reply ends (a crash, a power
    cut) loses at most the output tokens after it."""
    model.set_script([{"usage": USAGE, "holdAfter": [1, 60]}])
    task = start_fake(machine, token, ask_model(request()), model="sonnet")
    task_id = task["id"]
    started = {**USAGE, "output_tokens": 1}
    try:
        deadline = time.monotonic() + 30
        while (shown := json.loads(boxctl(machine, "show", task_id, "--json").stdout))[
            "costCents"
        ] == 0:
            assert time.monotonic() < deadline, "message_start's cost was never logged"
            time.sleep(0.2)
        # On record while the reply is still held, before any kill: what message_start said.
        assert shown["costCents"] == pytest.approx(cost_of(started), rel=0, abs=1e-9), shown
        machine.run("systemctl", "kill", "--signal=KILL", f"box-broker@{task_id}.service")
        # Once boxd sees the broker gone it charges what the request still reserved
        # (ModelRequests.settle_gone), so the cost after the kill is that or, until then, what
        # was logged: never less. Read at once, it raced that settling.
        shown = json.loads(boxctl(machine, "show", task_id, "--json").stdout)
        assert shown["costCents"] >= cost_of(started) - 1e-9, shown
    finally:
        http(machine, "POST", f"/api/tasks/{task_id}/stop", token)


def over_budget_task(machine: Machine, token: str, model: ModelServer) -> str:
    """A task whose first model reply takes it past its 5-cent budget; its next request asks,
    and is sent again as long as the answer is "pending"."""
    model.set_script([{"usage": DEAR}, {"blocks": [{"type": "text", "text": "Second answer."}]}])
    prompt = "\n".join([ask_model(request()), ask_model(request("more"), "more.json", retry=True)])
    return str(start_fake(machine, token, prompt, model="sonnet", budgetCents=5)["id"])


def approval_events(machine: Machine, task_id: str) -> list[str]:
    story = machine.run(
        "journalctl", f"BOX_TASK={task_id}", "BOX_EVENT=approval", "-o", "cat", "--no-pager"
    ).stdout
    return story.splitlines()


def test_past_the_budget_the_owner_approves_first(
    machine: Machine, token: str, model: ModelServer
) -> None:
    task_id = over_budget_task(machine, token, model)
    approval = wait_for_approval(machine, task_id)
    assert approval["model"] == MODEL
    assert approval["key"].startswith("model.")
    worst = sum(reservation_cents(MODEL, -(-len(json.dumps(request("more"))) // 3), 1000, False))
    assert approval["question"] == (
        f"Let task {task_id} ask its model ({MODEL}) once more? It has spent 900.015 cents; "
        f"this request may cost up to {math.ceil(worst * 100) / 100:g} cents, which would take "
        "it past its budget of 5 cents."
    )
    assert approval["costCents"] == pytest.approx(worst)
    assert len(model.requests()) == 1
    boxctl(machine, "approve", approval["id"])
    task = finish(machine, task_id)
    assert task["state"] == "done", task
    assert "Second answer." in texts(task)[3]
    assert len(model.requests()) == 2


def test_past_the_budget_denied_is_never_sent(
    machine: Machine, token: str, model: ModelServer
) -> None:
    task_id = over_budget_task(machine, token, model)
    approval = wait_for_approval(machine, task_id)
    boxctl(machine, "deny", approval["id"])
    task = finish(machine, task_id)
    assert task["state"] == "done", task
    refused = texts(task)[3]
    assert refused.endswith("status 403"), refused
    assert len(approval_events(machine, task_id)) == 2
    assert (
        "The box owner did not approve more spending on the model: "
        f"task {task_id} has reached its budget of 5 cents." in refused
    )
    assert len(model.requests()) == 1


def test_past_the_budget_pending_is_retried_on_the_same_approval(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """No answer within BOX_APPROVAL_WAIT_MS: a 529, which Droid retries; the same request again
    finds the same approval, and the owner's yes then lets it through once."""
    task_id = over_budget_task(machine, token, model)
    approval = wait_for_approval(machine, task_id)
    attempts = f"/var/lib/box/tasks/{task_id}/work/attempts.txt"
    deadline = time.monotonic() + 30
    while machine.run("cat", attempts, check=False).stdout.count("status 529") < 2:
        assert time.monotonic() < deadline, "the request was not answered pending twice"
        time.sleep(0.1)
    assert wait_for_approval(machine, task_id) == approval
    assert len(model.requests()) == 1
    boxctl(machine, "approve", approval["id"])
    task = finish(machine, task_id)
    assert task["state"] == "done", task
    again = texts(task)[3]
    assert again.endswith("status 200") and "Second answer." in again, again
    assert len(model.requests()) == 2
    # Asked once and answered once, however often the request came.
    assert len(approval_events(machine, task_id)) == 2


def test_a_refused_key_ends_the_task_in_the_seeds_words(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """The upstream says 401 and the worker gives up at once, as Droid does: the task ends
    failed with the words for the key, not the worker's exit (the box stops the worker as it
    ends the task, so the worker may not live to log the 401 it got)."""
    model.set_script([{"status": 401, "error": "invalid x-api-key"}])
    prompt = "\n".join([ask_model(request()), "fail the model refused the key"])
    task = finish(machine, start_fake(machine, token, prompt, model="sonnet")["id"])
    assert task["state"] == "failed", task
    assert task["error"] == KEY_REFUSED
    (sent,) = model.requests()
    assert sent["headers"]["x-api-key"] == KEY


def test_a_task_without_hosts_reaches_the_model_and_nothing_else(
    machine: Machine, token: str, model: ModelServer
) -> None:
    model.set_script([])
    prompt = "\n".join(
        [
            ask_model(request()),
            "sh curl -sS -o /dev/null -w '%{http_code}' http://allowed.test/ 2>&1; true",
            f"sh curl -sS --noproxy '*' -m 5 {BASE_URL}/v1/messages 2>&1; true",
        ]
    )
    before = arrived(machine)
    task = finish(machine, start_fake(machine, token, prompt, model="sonnet", hosts=[])["id"])
    assert task["state"] == "done", task
    reply, proxied, direct = texts(task)[1:4]
    assert "All done." in reply and reply.endswith("status 200")
    assert proxied == "403"
    # No route out of the task's namespace: only the gateway reaches the model.
    assert "Failed to connect to model.test port 9443" in direct
    assert arrived(machine) == before
    assert len(model.requests()) == 1


def test_the_model_is_reached_over_https_with_the_machines_certificates(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """As Anthropic's API is: the broker checks the upstream's certificate against the box's
    CAs, from inside its sandbox."""
    assert model.base_url.startswith("https://")
    model.set_script([{"blocks": [{"type": "text", "text": "Over TLS."}]}])
    task = finish(machine, start_fake(machine, token, ask_model(request()), model="sonnet")["id"])
    assert task["state"] == "done", task
    assert "Over TLS." in texts(task)[1] and texts(task)[1].endswith("status 200")
    (sent,) = model.requests()
    assert sent["headers"]["x-api-key"] == KEY


@pytest.fixture(scope="module")
def droid_box() -> Iterator[Machine]:
    """A machine of its own with Droid installed (the session's has none, and a Droid task
    there fails for that first) and no model key in its vault."""
    for m in booted_box():
        install_droid(m)
        yield m


def test_a_droid_task_without_a_model_key_fails_saying_how_to_add_one(
    droid_box: Machine,
) -> None:
    token = droid_box.run("boxctl", "token", "create").stdout.strip()
    body = {"title": "Summarise the notes", "prompt": "Read notes.md.", "budgetCents": 50}
    status, created = http(droid_box, "POST", "/api/tasks", token, json.dumps(body))
    assert status == 201, created
    task = finish(droid_box, created["id"])
    assert task["state"] == "failed"
    assert task["error"] == NO_KEY
