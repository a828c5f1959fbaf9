"""Garbage at every route of a task's broker (boxd/broker/app.py, docs/spec/broker-api.txt), the
real broker on a real Unix socket, served as its unit serves it, with the manager kept in memory
as the broker's other tests keep it: bodies from the schemas of the routes' requests (the pydantic
models they were read with before boxd.reading.json_reader,
tests/support/old_request_models.py), broken (tests/support/fuzz_bodies.py), odd paths and
content types. Never a 5xx; every refusal {"error": "..."} in plain words (400, as the spec
says); the broker still answering afterwards. tests/vm/test_fuzz.py runs a real
broker of a real task."""

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from yarl import URL

from boxd.broker.app import make_broker
from boxd.broker.app_link import Apps
from tests.support.app_serving import runners
from tests.support.broker_serving import serving
from tests.support.fuzz_bodies import BODIES, FUZZ, Body, broken_bodies, segments, send
from tests.support.memory_log import MemoryLog, MemoryWaiter

Broker = tuple[aiohttp.ClientSession, MemoryLog]


@pytest.fixture
async def broker(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> AsyncIterator[Broker]:
    log = MemoryLog("", tools=("wallet.pay", "wallet.balance", "echo.say"), budget=100)
    path = str(tmp_path / "broker.sock")
    async with (
        runners(tmp_path) as apps,
        serving(make_broker(log, MemoryWaiter(log), log.task, apps, wait_seconds=0.01), path),
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path)) as session,
    ):
        yield session, log
    # Garbage is the client's fault: nothing logged as an error, no traceback in the journal.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def _send(broker: Broker, method: str, path: str, body: Body | None) -> None:
    url = URL(f"http://box{path}", encoded=True)
    await send(broker[0], method, url, body, {}, statuses=(400, 404, 405, 413))


async def _still_answering(broker: Broker) -> None:
    async with broker[0].get("http://box/task") as answer:
        assert answer.status == 200, await answer.text()
        assert (await answer.json())["task"]["id"] == broker[1].task["id"]


def test_every_route_is_fuzzed(tmp_path: Path) -> None:
    log = MemoryLog("")
    broker = make_broker(log, MemoryWaiter(log), log.task, Apps(tmp_path), wait_seconds=0.01)
    served = {
        f"{method} {path}"
        for path, methods in broker.routes().handlers.items()
        for method in methods
    }
    assert served == set(BODIES)


def _schema(model: type[BaseModel] | None) -> dict[str, Any] | None:
    return None if model is None else model.model_json_schema()


@pytest.mark.parametrize("route", list(BODIES))
@FUZZ
@given(data=st.data())
async def test_bodies_from_the_models_broken(
    broker: Broker, route: str, data: st.DataObject
) -> None:
    method, path = route.split(" ")
    body = data.draw(broken_bodies(_schema(BODIES[route])), label="body")
    await _send(broker, method, path, body)
    await _still_answering(broker)


ROUTE_PATHS = sorted({route.split(" ")[1] for route in BODIES})


@FUZZ
@given(
    method=st.sampled_from(("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")),
    path=st.sampled_from(ROUTE_PATHS) | segments().map(lambda segment: f"/{segment}"),
    suffix=st.sampled_from(("", "/", "/..", "/%00", "?a=%00", "//", "/x")),
)
async def test_paths_and_methods_it_does_not_serve(
    broker: Broker, method: str, path: str, suffix: str
) -> None:
    await _send(broker, method, path + suffix, None)
    await _still_answering(broker)
