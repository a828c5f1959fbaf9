"""Garbage at every route of the HTTP gateway (boxd/web/app.py), the real aiohttp app on a real
socket: bodies from the routes' models, broken (tests/support/fuzz_bodies.py), weird path parameters
and content types. Never a 5xx; every refusal {"error": "..."} in plain words; the gateway
still answering afterwards.

The manager behind it is a stand-in for the system bus: each call is marshalled by dbus-fast as
the real bus connection would (a string D-Bus cannot carry fails there, as it would), then
answered by the manager's own readers (parse_task_request, change_settings, the name checks),
so a body reaches as far as it would on a box. tests/vm/test_fuzz.py runs the real manager."""

import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from dbus_fast import Message, MessageType
from hypothesis import given
from hypothesis import strategies as st
from yarl import URL

from boxd.dbus.client import GatewayClient
from boxd.errors import BoxError, Problem, die
from boxd.manager import pairing, vault, workspaces
from boxd.manager.tokens import token_role
from boxd.reading.strict_json import loads
from boxd.web.app import make_app
from boxd.web.event_stream import EVENTS_PATH
from boxd.web.openapi import ROUTES, Route
from boxd.wire.ids import check_task_id
from boxd.wire.models.settings import Settings, change_settings
from boxd.wire.models.task_request import parse_task_request
from boxd.wire.models.token_limits import parse_limits
from tests.support.fuzz_bodies import FUZZ, Body, broken_bodies, fill_path, segments, send

OWNER = "box_owner"
TASK = {"id": "t000000001", "title": "t", "state": "queued"}


def _task(args: list[Any]) -> dict[str, Any]:
    check_task_id(args[0])
    return TASK


def _settings(args: list[Any]) -> dict[str, Any]:
    changes = loads(args[0], "the settings")
    if not isinstance(changes, dict):
        die(Problem.INVALID, "the settings must be a JSON object of names and values")
    return change_settings(Settings(), changes).model_dump(mode="json")


def _approval(args: list[Any]) -> dict[str, Any]:
    if not re.fullmatch(r"t[0-9a-z]{9}\.[^\x00]{1,200}", args[0]):
        die(Problem.NOT_FOUND, f"no approval {args[0][:80]}")
    return {"id": args[0], "state": "approved" if args[1] else "denied"}


# The manager's answers by method, after its own checks on the arguments (token excluded).
ANSWERS: dict[str, Callable[[list[Any]], Any]] = {
    "CreateTask": lambda args: {**TASK, "title": parse_task_request(args[0]).title},
    "ListTasks": lambda args: {"tasks": [TASK]},
    "GetTask": lambda args: {**_task(args), "steps": []},
    "DiffTask": lambda args: {**_task(args), "files": []},
    "StopTask": _task,
    "UndoTask": _task,
    "KeepTask": _task,
    "ListApprovals": lambda args: {"approvals": []},
    "AnswerApproval": _approval,
    "ListWorkspaces": lambda args: [{"name": "home"}],
    "CreateWorkspace": lambda args: {"name": workspaces.check_name(args[0])},
    "RemoveWorkspace": lambda args: {"name": workspaces.check_name(args[0]), "trash": "/t"},
    "ListTokens": lambda args: [],
    "CreateToken": lambda args: (token_role(args[1]), parse_limits(args[2])) and "box_made",
    "RevokeToken": lambda args: die(Problem.NOT_FOUND, f"no token {args[0][:80]}"),
    "GetDroid": lambda args: {"state": "installed"},
    "GetAgents": lambda args: {"paused": False},
    "PauseAgents": lambda args: {"paused": True},
    "ResumeAgents": lambda args: {"paused": False},
    "Pair": lambda args: die(Problem.NOT_FOUND, pairing.WRONG),
    "GetSettings": lambda args: Settings().model_dump(mode="json"),
    "SetSettings": _settings,
    "ListSecrets": lambda args: [],
    "SetSecret": lambda args: {"name": vault.check_name(args[0])},
    "RemoveSecret": lambda args: {"name": vault.check_name(args[0])},
    "CreatePairing": lambda args: {
        "device": pairing.check_device_name(args[0]),
        "code": "ABCDE-FGHIJ",
        "expiresInSeconds": 600,
    },
    "OpenScreenSession": lambda args: die(Problem.UNAUTHORIZED, "that link was used already"),
    "CloseScreenSession": lambda args: {"ended": True},
}


# Asked with what the caller holds instead of a token: a pairing code, a login link's code.
OPEN_TO_ALL = ("Pair", "OpenScreenSession")


def _reply(message: Message, answer: Any) -> Message:
    return Message(
        message_type=MessageType.METHOD_RETURN,
        reply_serial=1,
        signature="s",
        body=[json.dumps(answer)],
    )


def _error(message: Message, failure: BoxError) -> Message:
    return Message(
        message_type=MessageType.ERROR,
        reply_serial=1,
        error_name=failure.problem.dbus_name,
        signature="s",
        body=[failure.message],
    )


class ManagerOnTheBus:
    """The system bus with the manager on it, as the gateway's GatewayClient sees it."""

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, message: Message) -> Message:
        # What dbus-fast does to every message before it goes on the socket.
        message._marshall(False)
        self.calls += 1
        token, *args = message.body
        try:
            if token != OWNER and message.member not in OPEN_TO_ALL:
                die(Problem.UNAUTHORIZED, "a valid bearer token is required")
            return _reply(message, ANSWERS[str(message.member)](args))
        except BoxError as failure:
            return _error(message, failure)


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
# The event stream is a long answer by design (its own tests: test_live_events.py).
FUZZED = [route for route in ROUTES if route.path != EVENTS_PATH]
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
