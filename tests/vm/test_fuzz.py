"""Issue 12, point 3, in a real box: a shorter run of the garbage of tests/test_fuzz_*.py at the
HTTP gateway (with an owner's token, through a forwarder into the machine) and at a running
task's broker.sock (reached from the host, through the bind of /var/lib/box). Never a 5xx; every
refusal {"error": "..."} in plain words; and afterwards boxd, boxd-web and the broker still
answer, none restarted, and no boxd unit logged a Traceback."""

import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from yarl import URL

from testbed.box_api import BROKER_UNIT, http, start_fake, unit_environment
from testbed.browser import _forwarder, _stop
from testbed.machine import Machine
from tests.support.fuzz_bodies import (
    BODIES,
    FUZZ,
    FUZZED,
    Body,
    broken_bodies,
    fill_path,
    segments,
    send,
)

GATEWAY_PORT = 7700
UNITS = ("boxd.service", "boxd-web.service")
# Fewer than the unit tests': every example crosses into a machine on two shared cores.
SHORT = settings(FUZZ, max_examples=40)


@pytest.fixture(scope="module", autouse=True)
def short_approval_wait(machine: Machine) -> Iterator[None]:
    """A fuzzed /ask waits 0.2 s for the owner, not 150 s, before it answers pending."""
    with unit_environment(machine, BROKER_UNIT, "BOX_APPROVAL_WAIT_MS", "200"):
        yield


def _restarts(machine: Machine, unit: str) -> tuple[str, int]:
    shown = machine.run("systemctl", "show", "-p", "ActiveState,NRestarts", unit).stdout
    fields = dict(line.split("=", 1) for line in shown.split())
    return fields["ActiveState"], int(fields["NRestarts"])


def _tracebacks(machine: Machine, since: float) -> str:
    units = [arg for unit in (*UNITS, "box-broker@*.service") for arg in ("-u", unit)]
    done = machine.run(
        "journalctl", "--no-pager", "-o", "cat", f"--since=@{since:.0f}", *units, check=False
    )
    lines = done.stdout.splitlines()
    found = [i for i, line in enumerate(lines) if "Traceback" in line]
    return "\n".join(lines[found[0] : found[0] + 40]) if found else ""


@pytest.fixture(scope="module")
def fuzzed_task(machine: Machine) -> Iterator[tuple[str, dict[str, Any]]]:
    """An owner's token and a fake task that sleeps, so its broker listens all along."""
    token = machine.run("boxctl", "token", "create").stdout.strip()
    task = start_fake(machine, token, "sleep 1200", tools=["wallet.pay", "wallet.balance"])
    yield token, task
    http(machine, "POST", f"/api/tasks/{task['id']}/stop", token)


@pytest.fixture(scope="module")
def watched(machine: Machine) -> Iterator[None]:
    """Nothing of the box restarted or logged a Traceback while the module fuzzed it."""
    since = time.time() - 1
    before = {unit: _restarts(machine, unit) for unit in UNITS}
    yield
    after = {unit: _restarts(machine, unit) for unit in UNITS}
    assert after == {unit: ("active", restarts) for unit, (_, restarts) in before.items()}
    logged = _tracebacks(machine, since)
    assert logged == "", logged


async def _check(
    session: aiohttp.ClientSession, method: str, url: str, body: Body | None, headers: Any
) -> None:
    await send(session, method, URL(url, encoded=True), body, headers)


@pytest.fixture
async def broker(
    machine: Machine, fuzzed_task: tuple[str, dict[str, Any]], watched: None
) -> AsyncIterator[aiohttp.ClientSession]:
    socket = machine.home / "tasks" / fuzzed_task[1]["id"] / "broker.sock"
    connector = aiohttp.UnixConnector(path=str(socket))
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session
    again = aiohttp.UnixConnector(path=str(socket))
    async with (
        aiohttp.ClientSession(connector=again) as session,
        session.get("http://box/task") as answer,
    ):
        assert answer.status == 200, await answer.text()


@SHORT
@given(data=st.data())
async def test_the_broker_of_a_real_task(broker: aiohttp.ClientSession, data: Any) -> None:
    route = data.draw(st.sampled_from(sorted(BODIES)), label="route")
    method, path = route.split(" ")
    model = BODIES[route]
    body = data.draw(broken_bodies(None if model is None else model.model_json_schema()))
    await _check(broker, method, f"http://box{path}", body, {})


@pytest.fixture
async def gateway(
    machine: Machine, fuzzed_task: tuple[str, dict[str, Any]], watched: None
) -> AsyncIterator[tuple[aiohttp.ClientSession, str, str]]:
    forwarder, port = _forwarder(machine, GATEWAY_PORT)
    try:
        connector = aiohttp.TCPConnector(limit=4)
        async with aiohttp.ClientSession(connector=connector) as session:
            yield session, f"http://127.0.0.1:{port}", fuzzed_task[0]
            async with session.get(
                f"http://127.0.0.1:{port}/api/tasks/{fuzzed_task[1]['id']}",
                headers={"Authorization": f"Bearer {fuzzed_task[0]}"},
            ) as answer:
                assert answer.status == 200, await answer.text()
                # Waiting: a fuzzed /ask of the broker's test is still open.
                assert json.loads(await answer.read())["state"] in ("running", "waiting")
    finally:
        _stop(forwarder)


# Not the routes that would change the box under the next examples: pausing the agents,
# the settings (a memory cap could stop the fuzzed task) and revoking tokens.
CHANGING = {("POST", "/api/pause"), ("PATCH", "/api/settings"), ("DELETE", "/api/tokens/{id}")}
ROUTES = [route for route in FUZZED if (route.method, route.path) not in CHANGING]


@SHORT
@given(data=st.data())
async def test_the_gateway_of_a_real_box(
    gateway: tuple[aiohttp.ClientSession, str, str], data: Any
) -> None:
    session, root, token = gateway
    route = data.draw(st.sampled_from(ROUTES), label="route")
    schema = None if route.body is None else route.body.model_json_schema()
    body = data.draw(broken_bodies(schema), label="body")
    path = fill_path(route.path, data.draw(segments(), label="segment"))
    await _check(session, route.method, root + path, body, {"Authorization": f"Bearer {token}"})
