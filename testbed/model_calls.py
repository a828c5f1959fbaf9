"""A task's calls to the model gateway in a machine against the scripted model upstream: asking,
reading the answer, what it cost, the approvals it waits for."""

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

from boxd.wire.pricing import Tokens, price_cents
from testbed.box_api import (
    BROKER_UNIT,
    boxctl,
    unit_environment,
)
from testbed.machine import Machine
from testbed.model_server import BASE_URL, DEFAULT_USAGE, ModelServer
from testbed.outside_world import start_outside

KEY = f"sk-ant-api03-{secrets.token_hex(24)}"
MODEL = "claude-sonnet-4-6"
USAGE = {
    "input_tokens": 1200,
    "output_tokens": 345,
    "cache_creation_input_tokens": 2000,
    "cache_read_input_tokens": 48000,
}


def outside_model(machine: Machine) -> Iterator[ModelServer]:
    """The model server in the machine's outside world and the box pointed at it, KEY in its
    vault; as a fixture of a module whose machine is its own, which sets nothing back."""
    outside = start_outside(machine)
    server = ModelServer(machine).start()
    boxctl(machine, "settings", "set", "modelBaseUrl", BASE_URL)
    set_key(machine)
    yield server
    server.stop()
    outside.kill()


def scripted_model(machine: Machine) -> Iterator[ModelServer]:
    """The model server, the box pointed at it with a key in its vault, and brokers that
    answer `pending` after 1.5 s."""
    with unit_environment(machine, BROKER_UNIT, "BOX_APPROVAL_WAIT_MS", "1500"):
        yield from outside_model(machine)
    boxctl(machine, "vault", "rm", "ANTHROPIC_API_KEY", check=False)
    boxctl(machine, "settings", "set", "modelBaseUrl", "https://api.anthropic.com")


def set_key(machine: Machine) -> None:
    machine.run("boxctl", "vault", "set", "ANTHROPIC_API_KEY", input=KEY + "\n")


def request(text: str = "hi", stream: bool = True) -> dict[str, Any]:
    return {
        "model": "claude-opus-4-6",
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": text}],
        "stream": stream,
    }


def ask_model(body: dict[str, Any], name: str = "request.json", *, retry: bool = False) -> str:
    """Script lines that send `body` to the gateway the way a worker's model client would, with
    a key of its own, and log the reply with its status. `retry`: sent again while the answer is
    529, as Droid does (without its backoff), and only the last reply logged."""
    curl = (
        "curl -sS -w '\\nstatus %{http_code}' -H 'x-api-key: the-workers-own' "
        "-H 'anthropic-version: 2023-06-01' -H 'content-type: application/json' "
        f'--data-binary @{name} "$BOX_MODEL_URL/v1/messages"'
    )
    if retry:
        # Each attempt's status goes to attempts.txt, for the test to see the retries.
        curl = (
            f'for i in $(seq 60); do r=$({curl}); echo "$r" | tail -n 1 >> attempts.txt; '
            'case "$r" in *"status 529") ;; *) break;; esac; done; echo "$r"'
        )
    return f"write {name} {json.dumps(body)}\nsh {curl}"


def texts(task: dict[str, Any]) -> list[str]:
    return [str(step["text"]) for step in task["steps"]]


def usage_cents(turns: int, usage: dict[str, int] = DEFAULT_USAGE) -> float:
    """What `turns` model turns of `usage` each (the scripted model's own by default) cost."""
    return turns * cost_of(usage)


def cost_of(*usages: dict[str, int]) -> float:
    total = 0.0
    for usage in usages:
        tokens = Tokens(
            input=usage.get("input_tokens", 0),
            output=usage.get("output_tokens", 0),
            cacheWrite=usage.get("cache_creation_input_tokens", 0),
            cacheRead=usage.get("cache_read_input_tokens", 0),
        )
        total += price_cents(MODEL, tokens)
    return total


def pending_model_approvals(machine: Machine, task_id: str) -> list[dict[str, Any]]:
    listed = json.loads(boxctl(machine, "approvals", "--json").stdout)
    return [a for a in listed if a["task"] == task_id and "model" in a]


def wait_for_approval(machine: Machine, task_id: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = pending_model_approvals(machine, task_id)
        if found:
            assert len(found) == 1, found
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"task {task_id} asked nothing in {timeout} s")
