"""Garbage at every route of the HTTP gateway (boxd/web/app.py), the real aiohttp app on a real
socket: bodies from the routes' models, broken (tests/support/fuzz_bodies.py), weird path parameters
and content types. Never a 5xx; every refusal {"error": "..."} in plain words; the gateway
still answering afterwards.

The manager behind it is a stand-in for the system bus: each call is marshalled by dbus-fast as
the real bus connection would (a string D-Bus cannot carry fails there, as it would), then
answered by the manager's own readers (parse_task_request, change_settings, the name checks),
so a body reaches as far as it would on a box. tests/vm/test_fuzz.py runs the real manager."""

import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given
from hypothesis import strategies as st
from yarl import URL

from boxd.dbus.client import GatewayClient
from boxd.web.app import make_app
from boxd.web.openapi import Route
from tests.support.fuzz_bodies import FUZZ, FUZZED, Body, broken_bodies, fill_path, segments, send
from tests.support.manager_on_the_bus import OWNER, ManagerOnTheBus

Gateway = tuple[aiohttp.ClientSession, URL, ManagerOnTheBus]


@pytest.fixture
async def gateway(caplog: pytest.LogCaptureFixture) -> AsyncIterator[Gateway]:
    bus = ManagerOnTheBus()
    app: web.Application = make_app(GatewayClient(bus))  # type: ignore[arg-type]
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        yield session, server.make_url(""), bus
    # Garbage is the client's fault: nothing logged as an error, no traceback in the journal.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


HEADERS = {"Authorization": f"Bearer {OWNER}"}
WITH_BODY = [route for route in FUZZED if route.body is not None]
WITH_PARAMETER = [route for route in FUZZED if "{" in route.path]


async def _send(
    gateway: Gateway, method: str, path: str, body: Body | None, headers: dict[str, str]
) -> None:
    session, root, _ = gateway
    await send(session, method, URL(str(root).rstrip("/") + path, encoded=True), body, headers)


async def _still_answering(gateway: Gateway) -> None:
    session, root, _ = gateway
    async with session.get(root / "api/pause", headers=HEADERS) as answer:
        assert answer.status == 200, await answer.text()
        assert await answer.json() == {"paused": False}


def _name(route: Route) -> str:
    return f"{route.method} {route.path}"


@pytest.mark.parametrize("route", WITH_BODY, ids=_name)
@FUZZ
@given(data=st.data())
async def test_bodies_from_the_models_broken(
    gateway: Gateway, route: Route, data: st.DataObject
) -> None:
    assert route.body is not None
    body = data.draw(broken_bodies(route.body.model_json_schema()), label="body")
    path = fill_path(route.path, data.draw(segments(), label="segment"))
    await _send(gateway, route.method, path, body, HEADERS)
    await _still_answering(gateway)


@pytest.mark.parametrize("route", FUZZED, ids=_name)
@FUZZ
@given(data=st.data())
async def test_path_parameters_and_stray_bodies(
    gateway: Gateway, route: Route, data: st.DataObject
) -> None:
    path = fill_path(route.path, data.draw(segments(), label="segment"))
    body = data.draw(st.none() | broken_bodies(None), label="body")
    await _send(gateway, route.method, path, body, HEADERS)
    await _still_answering(gateway)


TOKENS = st.sampled_from(("", "Bearer", "Bearer ", "Basic x", "bearer x", "Bearer \u00e9")) | (
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=60).map(
        lambda text: f"Bearer {text}"
    )
)


@pytest.mark.parametrize("route", FUZZED, ids=_name)
@FUZZ
@given(data=st.data())
async def test_tokens_that_are_not_tokens(
    gateway: Gateway, route: Route, data: st.DataObject
) -> None:
    path = fill_path(route.path, "t000000001")
    token = data.draw(TOKENS, label="authorization")
    await _send(gateway, route.method, path, None, {"Authorization": token})
    await _still_answering(gateway)
