"""The attacker's tests of the owner's money at the model gateway, in a real box: fake tasks that
speak to their gateway with curl the way a hostile worker would, a scripted model in the
machine's outside world (testbed/model_server.py), the real broker, manager, bus and systemd.

Each of these spent the owner's money unseen, or let a task past what the owner allowed, on
main before issue 32: the comment above each says what it did then."""

import json
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest

from boxd.broker.model.body import MAX_REQUEST
from boxd.broker.model.in_flight import MAX_IN_FLIGHT
from boxd.broker.model.request import BYTES_PER_TOKEN
from boxd.wire.pricing import reservation_cents
from testbed.box_api import (
    BROKER_UNIT,
    boxctl,
    finish,
    http,
    start_fake,
    unit_environment,
    wait_for_step,
)
from testbed.machine import Machine
from testbed.model_calls import (
    MODEL,
    USAGE,
    ask_model,
    cost_of,
    pending_model_approvals,
    request,
    scripted_model,
    texts,
    wait_for_approval,
)
from testbed.model_server import BASE_URL, PLAIN_URL, ModelServer
from testbed.outside_world import PRIVATE_ADDRESS


@pytest.fixture(scope="module")
def model(machine: Machine) -> Iterator[ModelServer]:
    yield from scripted_model(machine)


CURL = (
    "curl -sS -o /dev/null -w '%{{http_code}}' -H 'anthropic-version: 2023-06-01' "
    "-H 'content-type: application/json' {extra} --data-binary @{name} "
    '"$BOX_MODEL_URL/v1/messages"'
)


def shown(machine: Machine, task_id: str) -> dict[str, Any]:
    return dict(json.loads(boxctl(machine, "show", task_id, "--json").stdout))


def until_cost(machine: Machine, task_id: str, cents: float, timeout: float = 60) -> float:
    """The task's costCents once it reaches `cents` (costs may come after its end)."""
    deadline = time.monotonic() + timeout
    while True:
        cost = float(shown(machine, task_id)["costCents"])
        if cost >= cents - 1e-9 or time.monotonic() > deadline:
            return cost
        time.sleep(0.2)


def reserved_output(body: dict[str, Any]) -> float:
    return reservation_cents(MODEL, 0, body["max_tokens"], False)[1]


def worst_case(body: dict[str, Any]) -> float:
    """What the gateway reserves for `body` as the fake worker writes it."""
    size = len(json.dumps(body).encode())
    tokens = -(-size // BYTES_PER_TOKEN)
    return sum(reservation_cents(MODEL, tokens, body["max_tokens"], False))


def test_workers_that_hang_up_before_whole_replies_come_pay_for_every_one(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """Before: four requests, not streamed, each hung up (curl -m 1) before its reply came
    (3 s): every reply met a closed connection, its usage was dropped, and costCents stayed 0.
    Now each reply is read to its end and charged."""
    usage = {**USAGE, "output_tokens": 7}
    model.set_script([{"usage": usage, "delay": 3, "stream": False} for _ in range(4)])
    body = request(stream=False)
    curl = CURL.format(extra="-m 1", name="request.json")
    prompt = "\n".join(
        [
            f"write request.json {json.dumps(body)}",
            f"sh for i in 1 2 3 4; do {curl} & done; wait; true",
            "sleep 6",
        ]
    )
    task = finish(machine, start_fake(machine, token, prompt, model="sonnet")["id"])
    assert task["state"] == "done", task
    assert len(model.requests()) == 4
    assert until_cost(machine, task["id"], 4 * cost_of(usage)) == pytest.approx(
        4 * cost_of(usage), rel=0, abs=1e-9
    )


def test_a_broker_whose_worker_hung_up_stays_until_the_reply_is_charged(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """Before: with the worker gone, a broker idle for BOX_BROKER_IDLE_MS (here 0.5 s) exited
    with the upstream request still open, and its reply was never charged. Now an open upstream
    request keeps the broker busy."""
    usage = {**USAGE, "output_tokens": 9}
    model.set_script([{"usage": usage, "delay": 4, "stream": False}])
    body = request(stream=False)
    curl = CURL.format(extra="-m 1", name="request.json")
    prompt = "\n".join([f"write request.json {json.dumps(body)}", f"sh {curl}; true", "sleep 8"])
    with unit_environment(machine, BROKER_UNIT, "BOX_BROKER_IDLE_MS", "500"):
        task = finish(machine, start_fake(machine, token, prompt, model="sonnet")["id"])
    assert task["state"] == "done", task
    assert until_cost(machine, task["id"], cost_of(usage)) == pytest.approx(
        cost_of(usage), rel=0, abs=1e-9
    )


def test_a_stream_cut_before_its_usage_is_charged_what_was_reserved(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """Before: a stream that ended before message_delta was charged its input and one output
    token, whatever the model had written. Now the rest of what was reserved (max_tokens at the
    output price) is charged."""
    # Its message_start, then a text block begun and a delta of it: no message_delta.
    text = [{"type": "text", "text": "The start of an answer"}]
    model.set_script([{"usage": USAGE, "blocks": text, "cutAfter": 3}])
    body = request()
    task = finish(machine, start_fake(machine, token, ask_model(body), model="sonnet")["id"])
    assert task["state"] == "done", task
    # The input message_start said, and the most output the request allowed.
    most = {**USAGE, "output_tokens": body["max_tokens"]}
    assert task["costCents"] == pytest.approx(cost_of(most), rel=0, abs=1e-9)


def test_a_reply_still_coming_when_its_task_ends_is_charged_after_the_end(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """Before: the owner stopped the task while a reply streamed; the reply's end was refused
    by LogCost ("task has ended"), and only what message_start said was charged. Now costs
    that come after the end are recorded, and the broker reads the reply on as it stops."""
    model.set_script([{"usage": USAGE, "holdAfter": [2, 4]}])
    task = start_fake(machine, token, ask_model(request()), model="sonnet")
    task_id = task["id"]
    started = {**USAGE, "output_tokens": 1}
    assert until_cost(machine, task_id, cost_of(started)) == pytest.approx(
        cost_of(started), rel=0, abs=1e-9
    )
    status, stopped = http(machine, "POST", f"/api/tasks/{task_id}/stop", token)
    assert status == 200, stopped
    assert until_cost(machine, task_id, cost_of(USAGE)) == pytest.approx(
        cost_of(USAGE), rel=0, abs=1e-9
    )
    assert shown(machine, task_id)["state"] == "failed"


def test_a_broker_killed_mid_reply_is_charged_what_its_request_reserved(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """Before: a broker killed after message_start lost the rest of the reply's cost for good.
    Now the request stays open in the record, and once its broker is seen gone (here: the
    task's end) it is charged what it still reserved: its max_tokens of output."""
    model.set_script([{"usage": USAGE, "holdAfter": [1, 60]}])
    body = request()
    task = start_fake(machine, token, ask_model(body), model="sonnet")
    task_id = task["id"]
    started = {**USAGE, "output_tokens": 1}
    until_cost(machine, task_id, cost_of(started))
    machine.run("systemctl", "kill", "--signal=KILL", f"box-broker@{task_id}.service")
    http(machine, "POST", f"/api/tasks/{task_id}/stop", token)
    expected = cost_of({**USAGE, "output_tokens": body["max_tokens"]})
    assert until_cost(machine, task_id, expected) == pytest.approx(expected, rel=0, abs=1e-9)


def test_requests_in_flight_are_counted_before_the_next_goes(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """Before: a budget check reserved nothing for the request it let through, so requests at
    once each saw only what was spent (0) and none was asked about. Now the first's worst case
    is reserved while it streams, and the second, which would not fit beside it, asks."""
    body = {**request(), "max_tokens": 2000}
    budget = int(worst_case(body) * 1.5)
    model.set_script([{"usage": USAGE, "holdAfter": [1, 6]}])
    curl = CURL.format(extra="", name="request.json")
    second = CURL.format(extra="", name="second.json")
    prompt = "\n".join(
        [
            f"write request.json {json.dumps(body)}",
            f"write second.json {json.dumps({**body, 'metadata': {'user_id': 'two'}})}",
            f"sh ({curl} > first.txt &); sleep 2; {second}; true",
            "sleep 6",
        ]
    )
    task = start_fake(machine, token, prompt, model="sonnet", budgetCents=budget)
    approval = wait_for_approval(machine, task["id"])
    # The first is streaming: its output's worst case is held while the second would go.
    held = f", with {math.ceil(reserved_output(body) * 100) / 100:g} cents more held for requests"
    assert held in approval["question"], approval["question"]
    assert len(model.requests()) == 1
    # Unanswered within BOX_APPROVAL_WAIT_MS, the second request is a 529 Droid would retry.
    wait_for_step(machine, task["id"], 3)
    assert texts(shown(machine, task["id"]))[2] == "529"
    boxctl(machine, "deny", approval["id"])
    finish(machine, task["id"])
    assert len(model.requests()) == 1


def test_one_yes_lets_one_request_through(machine: Machine, token: str, model: ModelServer) -> None:
    """Before: the owner's yes was keyed on the body's hash and never spent, so the attacker
    sent the same bytes again and again after its first answer, and each went without asking.
    Now the yes is spent once its request is answered 200: the same bytes ask anew."""
    dear = {"input_tokens": 3_000_000, "output_tokens": 10}
    model.set_script([{"usage": dear}, {"blocks": [{"type": "text", "text": "Once."}]}])
    once = {**request("once more"), "metadata": {"user_id": "again"}}
    curl = CURL.format(extra="", name="more.json")
    retry = (
        f"for i in $(seq 60); do s=$({curl}); echo $s >> tries.txt; "
        '[ "$s" = 529 ] || break; done; echo $s'
    )
    prompt = "\n".join(
        [
            ask_model(request()),
            f"write more.json {json.dumps(once)}",
            f"sh {retry}",
            f"sh {curl}",
        ]
    )
    task = start_fake(machine, token, prompt, model="sonnet", budgetCents=5)
    approval = wait_for_approval(machine, task["id"])
    boxctl(machine, "approve", approval["id"])
    wait_for_step(machine, task["id"], 4)
    ended = finish(machine, task["id"])
    assert texts(ended)[3] == "200", texts(ended)
    # The same bytes again, after a 200: not under that yes.
    assert texts(ended)[4] == "529", texts(ended)
    assert len(model.requests()) == 2
    asked = [a for a in pending_model_approvals(machine, task["id"])]
    assert asked == [] or asked[0]["key"] == f"{approval['key']}.2"
    events = machine.run(
        "journalctl", f"BOX_TASK={task['id']}", "BOX_EVENT=approval", "-o", "cat", "--no-pager"
    ).stdout.splitlines()
    # Asked, answered, asked again (and closed by the task's end).
    assert len(events) >= 3, events


@pytest.mark.parametrize(
    ("change", "header", "named"),
    [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "", "web_search"),
        ({"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}, "", "web_fetch"),
        (
            {"mcp_servers": [{"type": "url", "url": "https://allowed.test/mcp", "name": "m"}]},
            "",
            "mcp_servers",
        ),
        ({"container": "container_011"}, "", "container"),
        ({}, "-H 'anthropic-beta: mcp-client-2025-04-04'", "mcp-client-2025-04-04"),
        ({}, "-H 'anthropic-beta: context-1m-2025-08-07'", "context-1m-2025-08-07"),
    ],
)
def test_what_reaches_past_the_tasks_network_rules_is_refused(
    machine: Machine,
    token: str,
    model: ModelServer,
    change: dict[str, Any],
    header: str,
    named: str,
) -> None:
    """Before: a task with no hosts had Anthropic's servers search, fetch, run code or reach an
    MCP server for it, and they were billed at rates the box never priced: the gateway passed
    the body and anthropic-beta as sent. Now each is a 400 that names what was refused, and the
    model never sees it."""
    model.set_script([])
    body = {**request(), **change}
    curl = CURL.format(extra=header, name="request.json").replace(
        "-o /dev/null -w '%{http_code}'", "-w ' %{http_code}'"
    )
    prompt = "\n".join([f"write request.json {json.dumps(body)}", f"sh {curl}"])
    task = finish(machine, start_fake(machine, token, prompt, model="sonnet", hosts=[])["id"])
    said = texts(task)[1]
    assert said.endswith(" 400") and named in said, said
    assert model.requests() == []


def test_the_model_key_goes_only_where_the_owner_named(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """Before: modelBaseUrl took plain http to any host, so the key crossed the network in
    clear (here to the plain server of model.test), and a name the owner gave could resolve to
    a private address (DNS the attacker controls) and the key went there. Now plain http is
    refused but to this machine's loopback, and the upstream's address is screened at each
    connection."""
    plain = ModelServer(machine, tls=False).start()
    try:
        refused = boxctl(machine, "settings", "set", "modelBaseUrl", PLAIN_URL, check=False)
        assert refused.returncode != 0
        assert "plain http is only for this machine's own loopback" in refused.stderr
        plain.set_script([])
        # What a task that got the setting past the owner would have sent: nothing arrives.
        task = finish(
            machine, start_fake(machine, token, ask_model(request()), model="sonnet")["id"]
        )
        assert plain.requests() == []
        assert texts(task)[1].endswith("status 200")
    finally:
        plain.stop()
    # A name of the owner's, pointed by DNS at a private address.
    hosts = machine.run("cat", "/etc/hosts").stdout
    machine.run("sh", "-c", f"echo '{PRIVATE_ADDRESS} model.test' > /etc/hosts.test")
    machine.run(
        "sh",
        "-c",
        "cat /etc/hosts.test /etc/hosts > /etc/hosts.new && mv /etc/hosts.new /etc/hosts",
    )
    try:
        model.set_script([])
        task = finish(
            machine, start_fake(machine, token, ask_model(request()), model="sonnet")["id"]
        )
        said = texts(task)[1]
        assert said.endswith("status 503"), said
        assert f"model.test resolves to {PRIVATE_ADDRESS}, a private network's address" in said
        assert model.requests() == []
    finally:
        machine.run("tee", "/etc/hosts", input=hosts)
    assert BASE_URL.startswith("https://")


def _broker_memory(machine: Machine, task_id: str) -> tuple[int, int]:
    """The broker's main process and the most memory it has held (VmHWM, in bytes)."""
    unit = f"box-broker@{task_id}.service"
    pid = int(machine.run("systemctl", "show", "-p", "MainPID", "--value", unit).stdout)
    status = machine.run("cat", f"/proc/{pid}/status").stdout
    (line,) = [line for line in status.splitlines() if line.startswith("VmHWM:")]
    return pid, int(line.split()[1]) * 1024


def test_the_largest_bodies_leave_the_broker_alive(
    machine: Machine, token: str, model: ModelServer
) -> None:
    """Before: a 32 MiB body was decoded whole to replace its model, some 25 times its size
    (here a list of 11 million empty objects, 800 MiB): past the broker's MemoryMax of 512 MiB,
    so a real box's kernel killed the broker and the replies it had in flight. This test
    machine enforces no cgroup limit, so the broker's peak is measured against MemoryMax. Now
    it is refused as more values than any model takes, and the largest body a model could take
    is read and forwarded in memory bounded by its size."""
    model.set_script([])
    # The largest bodies the cap allows: objects and nothing else, and a conversation of
    # 96,000 blocks padded to 32 MiB (a third of the values the gateway takes).
    make = "; ".join(
        [
            "size = 32 * 1024 * 1024 - 4096",
            'head = b\'{"max_tokens":1000,"messages":\'',
            "dense = head + b'[' + b'{},' * ((size - len(head)) // 3 - 2) + b'{}]}'",
            "open('dense.json', 'wb').write(dense)",
            "count = 96_000",
            "pad = (size - len(head) - 64) // count - 26",
            'block = b\'{"type":"text","text":"\' + b\'y\' * pad + b\'"}\'',
            'wide = head + b\'[{"role":"user","content":[\' + b\',\'.join([block] * count)'
            " + b']}]}'",
            "open('wide.json', 'wb').write(wide)",
        ]
    )
    curl = CURL.format(extra="", name="BODY").replace("-o /dev/null", "-o said.txt")
    prompt = "\n".join(
        [
            f"write make.py {make}",
            "sh python3 make.py && ls -l dense.json wide.json | awk '{print $5}' | tr '\\n' ' '",
            "sh " + curl.replace("BODY", "dense.json") + "; head -c 300 said.txt",
            "sh " + curl.replace("BODY", "wide.json"),
            "sleep 60",
        ]
    )
    task = start_fake(machine, token, prompt, model="sonnet", budgetCents=10_000)
    task_id = task["id"]
    try:
        wait_for_step(machine, task_id, 4, timeout=120)
        pid, peak = _broker_memory(machine, task_id)
        unit = f"box-broker@{task_id}.service"
        memory_max = int(
            machine.run("systemctl", "show", "-p", "MemoryMax", "--value", unit).stdout
        )
        assert memory_max == 512 * 1024 * 1024
        # Room left for the other requests a task may have in flight, each holding its body.
        others = (MAX_IN_FLIGHT - 1) * MAX_REQUEST
        assert peak + others < memory_max, f"the broker held {peak / 2**20:.0f} MiB at its peak"
        steps = texts(shown(machine, task_id))
        sizes = [int(n) for n in steps[1].split()]
        assert all(size > 31 * 1024 * 1024 for size in sizes), sizes
        assert steps[2].startswith("413"), steps[2]
        assert "more than 300,000 JSON values" in steps[2]
        assert steps[3] == "200", steps[3]
        assert len(model.requests()) == 1
        # The same broker all along: never killed and started again.
        restarts = machine.run("systemctl", "show", "-p", "NRestarts", "--value", unit).stdout
        assert (restarts.strip(), _broker_memory(machine, task_id)[0]) == ("0", pid)
    finally:
        http(machine, "POST", f"/api/tasks/{task_id}/stop", token)
