"""The model gateway in the broker, between a client speaking Anthropic's Messages API and a
fake upstream (a real aiohttp server on 127.0.0.1), with the manager's side as boxd runs it
(boxd.manager.model_requests on a real SQLite record; D-Bus a stand-in). The real manager,
D-Bus, systemd and the task's namespace are in tests/vm/test_model_gateway.py and
tests/vm/test_model_money.py."""

import asyncio
import contextlib
import hashlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web
from dbus_fast.aio import MessageBus

from boxd.broker.model import exchange as model_exchange
from boxd.broker.model import gateway as model_gateway
from boxd.broker.model.body import MAX_REQUEST
from boxd.broker.model.gateway import ModelGateway
from boxd.broker.model.in_flight import MAX_IN_FLIGHT
from boxd.broker.model.key import ModelKey
from boxd.broker.model.usage import MAX_LINE, JsonUsage, StreamUsage
from boxd.dbus import interface as api
from boxd.errors import BoxError, Problem
from boxd.manager.approval_answers import ApprovalAnswers
from boxd.manager.model_requests import ModelRequests
from boxd.manager.record.ledger import TaskSave
from boxd.manager.record.records import Records
from boxd.manager.record.store import Store
from boxd.wire.caller import Caller, Role
from boxd.wire.event import EventKind
from boxd.wire.model_key import KEY_REFUSED
from boxd.wire.models.settings import Settings
from boxd.wire.models.task import TaskState
from boxd.wire.models.task_request import Autonomy, DroidOptions
from boxd.wire.pricing import Tokens, price_cents, reservation_cents
from tests.support.broker_methods import QuietBus
from tests.support.presence import Presence
from tests.support.tasks import a_task

KEY = "sk-ant-api03-the-owners-own-key"
MODEL = "claude-sonnet-4-6"
TASK = "t000000001"
BROKER = Caller(Role.BROKER, ":1.7", task=TASK)
OWNER = Caller(Role.OWNER, "owner")
USAGE = {
    "input_tokens": 1200,
    "output_tokens": 345,
    "cache_creation_input_tokens": 2000,
    "cache_read_input_tokens": 48000,
}


def sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def reply_events(usage: dict[str, int], text: str = "Hello there.") -> list[bytes]:
    start = {**usage, "output_tokens": 1}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL}
    return [
        sse("message_start", {"type": "message_start", "message": {**message, "usage": start}}),
        sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        ),
        sse("ping", {"type": "ping"}),
        sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": text},
            },
        ),
        sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        ),
        sse("message_stop", {"type": "message_stop"}),
    ]


@dataclass
class Turn:
    status: int = 200
    stream: bool = True
    usage: dict[str, int] = field(default_factory=lambda: dict(USAGE))
    # Set: the upstream sends the first two events, then waits for it before the rest.
    release: asyncio.Event | None = None
    # The upstream hangs up after this many events.
    cut_after: int | None = None
    # A whole reply (not streamed) waits for this before it is sent.
    hold: asyncio.Event | None = None


class Upstream:
    """A stand-in for Anthropic's API: answers scripted turns and keeps every request."""

    def __init__(self) -> None:
        self.turns: list[Turn] = []
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None
        # What replies wait for (Turn.release, Turn.hold): set as the upstream stops, so that a
        # reply a test left waiting ends then, not at aiohttp's shutdown timeout (60 s).
        self._waits: list[asyncio.Event] = []

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self.messages)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        for wait in self._waits:
            wait.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(({k.lower(): v for k, v in request.headers.items()}, body))
        turn = self.turns.pop(0) if self.turns else Turn()
        self._waits += [wait for wait in (turn.release, turn.hold) if wait is not None]
        if 300 <= turn.status < 400:
            raise web.HTTPTemporaryRedirect(f"{self.url}/v1/messages?stolen=1")
        if turn.status != 200:
            error = {"type": "error", "error": {"type": "x", "message": "invalid x-api-key"}}
            return web.json_response(error, status=turn.status)
        if not turn.stream:
            if turn.hold is not None:
                await turn.hold.wait()
            message = {"type": "message", "content": [], "model": body["model"]}
            return web.json_response({**message, "usage": turn.usage})
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        events = reply_events(turn.usage)
        if turn.cut_after is not None:
            for event in events[: turn.cut_after]:
                await response.write(event)
            assert request.transport is not None
            request.transport.close()
            return response
        for number, event in enumerate(events):
            if number == 2 and turn.release is not None:
                await turn.release.wait()
            await response.write(event)
        await response.write_eof()
        return response


class Manager:
    """The manager's side of the gateway as boxd runs it: BeginModelRequest and LogModelCost
    by boxd.manager.model_requests on a real record, the owner's answers by ApprovalAnswers."""

    def __init__(self, store: Store, task: dict[str, Any]) -> None:
        self.store = store
        self.records = Records(store, cast(MessageBus, QuietBus()))
        self.presence = Presence()
        self.models = ModelRequests(self.records, self.presence)
        self.answers = ApprovalAnswers(self.records)
        # The task as the gateway has it (GET /task, when its broker started).
        self.task = task
        self.refused = 0
        # Set: each LogModelCost waits for it before it reaches the record.
        self.cost_hold: asyncio.Event | None = None
        # BeginModelRequests that came while a LogModelCost was held.
        self.begun_while_held = 0
        self._costs_held = 0
        # How often the gateway began waiting for an answer.
        self.waits = 0
        self._news = asyncio.Event()

    async def until(self, check: Callable[[], Awaitable[bool] | bool]) -> None:
        """Waits until `check` holds, looking again after each thing the gateway does, and
        every 20 ms for what the upstream does; for 5 s at most."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while True:
            held = check()
            if held if isinstance(held, bool) else await held:
                return
            assert loop.time() < deadline, "what the test waited for never came"
            self._news.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._news.wait(), 0.02)

    def tell(self) -> None:
        self._news.set()

    async def call(self, method: api.Method, *args: str) -> Any:
        member = api.bound_on(api.BROKER, method).name
        try:
            if member == "ModelKeyRefused":
                self.refused += 1
                return self.task
            if member == "BeginModelRequest":
                self.begun_while_held += self._costs_held > 0
                return await self.models.begin(BROKER, TASK, *args)
            assert member == "LogModelCost", member
            if self.cost_hold is not None:
                self._costs_held += 1
                await self.cost_hold.wait()
                self._costs_held -= 1
            return await self.models.log_cost(BROKER, TASK, *args)
        finally:
            self.tell()

    async def set_task(self, **update: Any) -> None:
        task = (await self.records.task(TASK)).model_copy(update=update)
        await self.records.record(TaskSave(task, EventKind.TASK_STATE, {"state": task.state.value}))
        self.task.update(task.public())

    async def costs(self) -> list[dict[str, Any]]:
        return [event.data for event in await self.store.events(TASK, EventKind.COST)]

    async def spent(self) -> float:
        return (await self.records.task(TASK)).costCents

    async def asked(self) -> list[dict[str, Any]]:
        return [a.public() for a in await self.store.approvals(task_id=TASK)]

    async def answer(self, approval: dict[str, Any], approved: bool) -> None:
        await self.answers.answer_approval(OWNER, approval["id"], approved)
        self.tell()

    async def open_requests(self) -> int:
        return len(await self.store.model_requests(TASK))


class Waiter:
    """Waits for the owner's answer as the broker's ApprovalWaiter does, reading the record."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager

    async def wait(self, approval: dict[str, Any], seconds: float) -> str:
        if approval["state"] != "pending":
            return str(approval["state"])
        self.manager.waits += 1
        self.manager.tell()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while loop.time() < deadline:
            found = await self.manager.store.approval(approval["id"])
            assert found is not None
            if found.state != "pending":
                return str(found.state)
            await asyncio.sleep(0.01)
        return "pending"


@dataclass
class Rig:
    url: str
    upstream: Upstream
    manager: Manager
    gateway: ModelGateway
    in_flight: dict[str, float]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    upstream = Upstream()
    await upstream.start()
    store = Store(tmp_path / "box.db")
    await store.open()
    await store.save_settings(Settings(modelBaseUrl=upstream.url))
    task = a_task().model_copy(
        update={"state": TaskState.RUNNING, "model": MODEL, "budgetCents": 1000}
    )
    manager = Manager(store, task.public())
    manager.records.export(task)
    await manager.records.record(TaskSave(task, EventKind.TASK_STATE, {"state": "running"}))
    in_flight: dict[str, float] = {}
    gateway = ModelGateway(
        manager,
        Waiter(manager),
        manager.task,
        0.2,
        lambda: dict(in_flight),
        read_key=lambda: ModelKey("ANTHROPIC_API_KEY", KEY),
    )
    runner = web.AppRunner(gateway.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield Rig(f"http://127.0.0.1:{runner.addresses[0][1]}", upstream, manager, gateway, in_flight)
    await runner.cleanup()
    await gateway.close()
    await upstream.stop()
    await store.close()


async def post_to(gateway: ModelGateway, rig: Rig) -> tuple[int, bytes]:
    """One Droid request to a gateway other than the rig's own, served for that request only."""
    runner = web.AppRunner(gateway.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    rig.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        status, body, _ = await post(rig, droid_request())
    finally:
        await runner.cleanup()
        await gateway.close()
    return status, body


def droid_request(text: str = "hi", stream: bool = True) -> dict[str, Any]:
    return {
        "model": "claude-opus-4-6",
        "max_tokens": 8192,
        "messages": [{"role": "user", "content": text}],
        "system": [
            {"type": "text", "text": "You are Droid.", "cache_control": {"type": "ephemeral"}}
        ],
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
        "tools": [{"name": "Read", "description": "Reads a file.", "input_schema": {}}],
        "stream": stream,
    }


def worst_case(body: dict[str, Any]) -> float:
    """What the gateway reserves for `body`: a token a 3 bytes of it at the cache write's price,
    and its max_tokens at the output price."""
    size = len(json.dumps(body).encode())
    return sum(reservation_cents(MODEL, -(-size // 3), body["max_tokens"], False))


DROID_HEADERS = {
    "x-api-key": "x",
    "authorization": "Bearer stolen",
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "interleaved-thinking-2025-05-14",
    "user-agent": "factory-cli/0.225.2",
    "cookie": "session=1",
}


async def post(
    rig: Rig,
    body: dict[str, Any] | bytes,
    path: str = "/v1/messages",
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes, dict[str, str]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{rig.url}{path}", data=data, headers=headers or DROID_HEADERS) as reply,
    ):
        return reply.status, await reply.read(), dict(reply.headers)


def expected_cost(usage: dict[str, int], **more: Any) -> dict[str, Any]:
    tokens = Tokens(
        input=usage["input_tokens"],
        output=usage["output_tokens"],
        cacheWrite=usage["cache_creation_input_tokens"],
        cacheRead=usage["cache_read_input_tokens"],
    )
    return {
        "cents": pytest.approx(price_cents(MODEL, tokens), rel=0, abs=1e-9),
        "what": "model",
        "model": MODEL,
        "tokens": tokens.json(),
        **more,
    }


def streamed_costs(usage: dict[str, int]) -> list[dict[str, Any]]:
    """A streamed reply's cost events: what message_start said (its usage with one output
    token, as reply_events sends), then what the counts grew by."""
    started = {**usage, "output_tokens": 1}
    grown = {name: usage[name] - started[name] for name in usage}
    return [expected_cost(started), expected_cost(grown)]


async def test_the_key_and_model_are_the_boxs_and_the_reply_streams_back(rig: Rig) -> None:
    status, body, headers = await post(rig, droid_request())
    assert status == 200
    assert headers["Content-Type"] == "text/event-stream"
    assert body == b"".join(reply_events(USAGE))
    ((sent, forwarded),) = rig.upstream.requests
    assert sent["x-api-key"] == KEY
    # Nothing of the worker's own authority passes: its key, its authorization, its cookie.
    assert "authorization" not in sent and "cookie" not in sent
    assert sent["anthropic-version"] == "2023-06-01"
    assert sent["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert forwarded == {**droid_request(), "model": MODEL}
    await rig.gateway.settled()
    assert await rig.manager.costs() == streamed_costs(USAGE)
    assert await rig.manager.spent() == pytest.approx(
        price_cents(MODEL, Tokens(1200, 345, 2000, 48000)), rel=0, abs=1e-9
    )
    assert await rig.manager.open_requests() == 0


async def test_the_next_request_is_begun_after_the_last_replys_cost_is_told(rig: Rig) -> None:
    """Droid sends its next request as soon as it has read a reply, while that reply's cost may
    still be on its way to the manager: begun then, the next request would be counted beside the
    finished one's worst case, and the owner asked about a budget the task is within (a flaky
    tests/vm/test_droid.py showed it, the owner asked for "48 cents more held for requests and
    calls not yet finished")."""
    await rig.manager.set_task(budgetCents=int(worst_case(droid_request()) * 1.5))
    asked_in_flight = 0
    arrived = asyncio.Event()

    def in_flight() -> dict[str, float]:
        # Read as a request is begun: the second time, the next request has come.
        nonlocal asked_in_flight
        asked_in_flight += 1
        if asked_in_flight == 2:
            arrived.set()
        return {}

    gateway = ModelGateway(
        rig.manager,
        Waiter(rig.manager),
        rig.manager.task,
        0.2,
        in_flight,
        read_key=lambda: ModelKey("ANTHROPIC_API_KEY", KEY),
    )
    runner = web.AppRunner(gateway.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    rig.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    rig.manager.cost_hold = asyncio.Event()
    try:
        assert (await post(rig, droid_request()))[0] == 200
        following = asyncio.create_task(post(rig, droid_request("and then?")))
        await arrived.wait()
        rig.manager.cost_hold.set()
        status, body, _ = await following
        await gateway.settled()
    finally:
        await runner.cleanup()
        await gateway.close()
    assert (status, rig.manager.begun_while_held) == (200, 0), body
    assert await rig.manager.asked() == []
    assert await rig.manager.open_requests() == 0


async def test_a_factory_key_goes_as_key_and_bearer(rig: Rig) -> None:
    gateway = ModelGateway(
        rig.manager,
        Waiter(rig.manager),
        rig.manager.task,
        0.2,
        dict,
        read_key=lambda: ModelKey("FACTORY_API_KEY", "fk-owner"),
    )
    assert (await post_to(gateway, rig))[0] == 200
    ((sent, _),) = rig.upstream.requests
    assert (sent["x-api-key"], sent["authorization"]) == ("fk-owner", "Bearer fk-owner")


async def test_the_first_bytes_arrive_before_the_upstream_has_finished(rig: Rig) -> None:
    release = asyncio.Event()
    rig.upstream.turns = [Turn(release=release)]
    events = reply_events(USAGE)
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{rig.url}/v1/messages", json=droid_request()) as reply,
    ):
        first = b""
        while len(first) < len(events[0] + events[1]):
            first += await asyncio.wait_for(reply.content.readany(), 5)
        # The upstream is still holding the rest of its reply.
        assert not release.is_set()
        assert first == events[0] + events[1]
        # What message_start said is logged already: a broker killed now would leave only the
        # output tokens to come to what it reserved.
        await rig.manager.until(lambda: _has_costs(rig, 1))
        assert await rig.manager.costs() == streamed_costs(USAGE)[:1]
        release.set()
        rest = await reply.read()
    assert first + rest == b"".join(events)
    await rig.gateway.settled()
    assert await rig.manager.costs() == streamed_costs(USAGE)


async def _has_costs(rig: Rig, count: int) -> bool:
    return len(await rig.manager.costs()) >= count


async def test_a_non_streamed_reply_is_metered_from_its_usage(rig: Rig) -> None:
    usage = {**USAGE, "output_tokens": 7}
    rig.upstream.turns = [Turn(stream=False, usage=usage)]
    status, body, _ = await post(rig, droid_request(stream=False))
    assert status == 200
    assert json.loads(body)["usage"] == usage
    await rig.gateway.settled()
    assert await rig.manager.costs() == [expected_cost(usage)]


async def test_a_reply_cut_off_before_its_final_usage_is_charged_its_reservation(
    rig: Rig,
) -> None:
    """The upstream hangs up after message_start: what it said is charged, and, since the reply
    never said how much it wrote, the most it could have: its max_tokens at the output price.
    (Before, only the input and one output token were.)"""
    rig.upstream.turns = [Turn(cut_after=3)]
    with contextlib.suppress(aiohttp.ClientPayloadError):
        await post(rig, droid_request())
    await rig.gateway.settled()
    start, rest = await rig.manager.costs()
    assert start == expected_cost({**USAGE, "output_tokens": 1})
    assert (rest["cents"], rest["reserved"]) == (pytest.approx(8191 * 15 / 10_000), True)


async def test_a_worker_that_hangs_up_mid_stream_pays_for_the_whole_reply(rig: Rig) -> None:
    """The attacker hangs up after the first bytes: the gateway reads on to the reply's end
    and charges all of it, and the broker is busy, not idle, while it does."""
    release = asyncio.Event()
    rig.upstream.turns = [Turn(release=release)]
    async with aiohttp.ClientSession() as session:
        reply = await session.post(f"{rig.url}/v1/messages", json=droid_request())
        await asyncio.wait_for(reply.content.readany(), 5)
        reply.close()
    await rig.manager.until(lambda: _has_costs(rig, 1))
    assert rig.gateway.busy()
    release.set()
    await rig.gateway.settled()
    assert await rig.manager.costs() == streamed_costs(USAGE)
    assert not rig.gateway.busy()


async def test_workers_that_hang_up_before_a_whole_reply_comes_pay_for_every_one(
    rig: Rig,
) -> None:
    """The attacker's requests at once, not streamed, each hung up before its reply came:
    before, none was charged (the reply met a closed connection and its usage was dropped) and
    none was asked about. Now each reply is read and charged, and the budget counts the worst
    case of those in flight: past it the next request asks."""
    count = MAX_IN_FLIGHT - 1
    each = worst_case(droid_request("0", stream=False))
    await rig.manager.set_task(budgetCents=int(count * each) + 1)
    hold = asyncio.Event()
    usage = {**USAGE, "output_tokens": 7}
    rig.upstream.turns = [Turn(stream=False, usage=usage, hold=hold) for _ in range(count)]
    url = f"{rig.url}/v1/messages"
    async with aiohttp.ClientSession() as session:
        sent = [
            asyncio.create_task(session.post(url, json=droid_request(str(n), stream=False)))
            for n in range(count)
        ]
        await rig.manager.until(lambda: len(rig.upstream.requests) == count)
        for request in sent:
            request.cancel()
        await asyncio.gather(*sent, return_exceptions=True)
    assert rig.gateway.busy()
    assert await rig.manager.open_requests() == count
    # Their worst cases fill the budget: one more request asks the owner first.
    status, _, _ = await post(rig, droid_request("one more", stream=False))
    assert status == 529
    hold.set()
    await rig.gateway.settled()
    assert await rig.manager.costs() == [expected_cost(usage)] * count
    assert await rig.manager.open_requests() == 0


async def test_over_budget_asks_first_and_approved_goes(rig: Rig) -> None:
    await rig.manager.set_task(costCents=1000.0)
    asking = asyncio.create_task(post(rig, droid_request()))
    await rig.manager.until(lambda: rig.manager.waits == 1)
    (asked,) = await rig.manager.asked()
    digest = hashlib.sha256(json.dumps(droid_request()).encode()).hexdigest()
    assert asked["key"] == f"model.{digest}"
    assert (asked["model"], asked["inputHash"]) == (MODEL, digest)
    assert asked["question"].startswith(
        f"Let task {TASK} ask its model ({MODEL}) once more? It has spent 1000 cents; this "
        "request may cost up to "
    )
    assert asked["question"].endswith(", which would take it past its budget of 1000 cents.")
    assert rig.upstream.requests == []
    await rig.manager.answer(asked, True)
    status, _, _ = await asking
    assert status == 200
    assert len(rig.upstream.requests) == 1


async def test_calls_in_flight_count_toward_the_budget(rig: Rig) -> None:
    reserve = worst_case(droid_request())
    await rig.manager.set_task(costCents=1000.0 - reserve - 40)
    rig.in_flight["line-4"] = 40.5
    status, _, _ = await post(rig, droid_request())
    assert status == 529
    (asked,) = await rig.manager.asked()
    assert "with 40.5 cents more held for requests and calls not yet finished" in asked["question"]
    rig.in_flight.clear()
    status, _, _ = await post(rig, droid_request("another"))
    assert status == 200


async def test_denied_is_never_forwarded(rig: Rig) -> None:
    await rig.manager.set_task(costCents=1500.0)
    asking = asyncio.create_task(post(rig, droid_request()))
    await rig.manager.until(lambda: rig.manager.waits == 1)
    (asked,) = await rig.manager.asked()
    await rig.manager.answer(asked, False)
    status, body, headers = await asking
    assert status == 403
    assert headers["x-should-retry"] == "false"
    assert json.loads(body) == {
        "type": "error",
        "error": {
            "type": "permission_error",
            "message": "The box owner did not approve more spending on the model: task "
            f"{TASK} has reached its budget of 1000 cents.",
        },
    }
    assert rig.upstream.requests == []


async def test_pending_is_an_error_droid_retries_and_one_yes_lets_one_request_through(
    rig: Rig,
) -> None:
    """Droid's retries of a request waiting for the owner find the same approval; the owner's
    yes lets that request through once. The attacker's replay of the same bytes after it was
    answered 200 asks again: before, it went without asking, again and again."""
    await rig.manager.set_task(costCents=1000.0)
    status, body, headers = await post(rig, droid_request())
    assert status == 529
    assert headers["x-should-retry"] == "true"
    error = json.loads(body)["error"]
    assert error["type"] == "overloaded_error"
    assert error["message"] == (
        f"Waiting for the box owner to approve more spending on the model: task {TASK} has "
        "reached its budget of 1000 cents. Send the request again to check."
    )
    assert rig.upstream.requests == []
    # Droid sends the same request again: the same approval, not a second question.
    retry = asyncio.create_task(post(rig, droid_request()))
    await rig.manager.until(lambda: rig.manager.waits == 2)
    (asked,) = await rig.manager.asked()
    await rig.manager.answer(asked, True)
    assert (await retry)[0] == 200
    assert len(await rig.manager.asked()) == 1
    # The same bytes again: that yes is spent, so the owner is asked anew.
    assert (await post(rig, droid_request()))[0] == 529
    assert len(rig.upstream.requests) == 1
    first, second = await rig.manager.asked()
    assert second["key"] == f"{first['key']}.2"


async def test_a_request_that_got_no_200_may_go_again_under_its_yes(rig: Rig) -> None:
    """What Droid's retries need: the upstream was overloaded, so the yes is not spent."""
    await rig.manager.set_task(costCents=1000.0)
    assert (await post(rig, droid_request()))[0] == 529
    (asked,) = await rig.manager.asked()
    await rig.manager.answer(asked, True)
    rig.upstream.turns = [Turn(status=529)]
    assert (await post(rig, droid_request()))[0] == 529
    assert (await post(rig, droid_request()))[0] == 200
    assert len(rig.upstream.requests) == 2
    assert len(await rig.manager.asked()) == 1


async def test_a_request_that_asked_waits_for_its_answer_even_if_it_fits_now(rig: Rig) -> None:
    await rig.manager.set_task(costCents=1000.0)
    assert (await post(rig, droid_request()))[0] == 529
    await rig.manager.set_task(costCents=0.0)
    assert (await post(rig, droid_request()))[0] == 529
    assert rig.upstream.requests == []


async def test_medium_autonomy_caps_the_budget_at_a_dollar(rig: Rig) -> None:
    await rig.manager.set_task(
        budgetCents=5000, costCents=100.0, droid=DroidOptions(autonomy=Autonomy.MEDIUM)
    )
    assert (await post(rig, droid_request()))[0] == 529
    assert "its budget of 100 cents" in (await rig.manager.asked())[0]["question"]


async def test_a_refused_key_is_reported_and_the_worker_told(rig: Rig) -> None:
    rig.upstream.turns = [Turn(status=401)]
    status, body, _ = await post(rig, droid_request())
    assert status == 401
    assert json.loads(body)["error"] == {"type": "authentication_error", "message": KEY_REFUSED}
    assert rig.manager.refused == 1
    await rig.gateway.settled()
    assert await rig.manager.costs() == []
    assert await rig.manager.open_requests() == 0


async def test_other_upstream_errors_pass_through_uncharged(rig: Rig) -> None:
    rig.upstream.turns = [Turn(status=529)]
    status, body, _ = await post(rig, droid_request())
    assert status == 529
    assert json.loads(body)["type"] == "error"
    assert rig.manager.refused == 0
    await rig.gateway.settled()
    assert await rig.manager.costs() == []
    assert await rig.manager.open_requests() == 0


async def test_an_upstream_that_is_not_there_is_a_retry(rig: Rig) -> None:
    await rig.upstream.stop()
    status, body, _ = await post(rig, droid_request())
    assert status == 503
    assert json.loads(body)["error"]["message"].startswith(
        f"the model at {rig.upstream.url} could not be reached"
    )
    await rig.gateway.settled()
    assert await rig.manager.open_requests() == 0


async def test_a_broker_told_to_stop_cuts_what_it_still_reads_and_has_it_charged(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its task ended: the reply being read gets FINISH_SECONDS, then is cut off and charged
    what was reserved for it (after message_start, its output)."""
    monkeypatch.setattr(model_gateway, "FINISH_SECONDS", 0.2)
    rig.upstream.turns = [Turn(release=asyncio.Event())]
    async with aiohttp.ClientSession() as session:
        reply = await session.post(f"{rig.url}/v1/messages", json=droid_request())
        await asyncio.wait_for(reply.content.readany(), 5)
        await rig.manager.until(lambda: _has_costs(rig, 1))
        await rig.gateway.close()
        reply.close()
    start, rest = await rig.manager.costs()
    assert start == expected_cost({**USAGE, "output_tokens": 1})
    assert (rest["cents"], rest["reserved"]) == (pytest.approx(8191 * 15 / 10_000), True)
    assert await rig.manager.open_requests() == 0


async def test_a_reply_still_coming_when_its_task_ends_is_charged_after_the_end(
    rig: Rig,
) -> None:
    """Before, LogCost refused a cost once the task had ended: the reply went uncharged."""
    release = asyncio.Event()
    rig.upstream.turns = [Turn(release=release)]
    asking = asyncio.create_task(post(rig, droid_request()))
    await rig.manager.until(lambda: _has_costs(rig, 1))
    await rig.manager.set_task(state=TaskState.DONE)
    release.set()
    await asking
    await rig.gateway.settled()
    assert await rig.manager.costs() == streamed_costs(USAGE)


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "the request body is not JSON: send a Messages API request"),
        (b"[1, 2]", 400, "the request body must be a JSON object: a Messages API request"),
        (b"[" * 100_000, 400, "the request body is not JSON: send a Messages API request"),
        (
            b'{"max_tokens": 10, "messages": []} x',
            400,
            "the request body is not JSON: send a Messages API request",
        ),
        (
            b"x" * (MAX_REQUEST + 1),
            413,
            "the request body is over 32 MiB, more than the model gateway takes",
        ),
        (
            b'{"messages": []}',
            400,
            "max_tokens is required: the most output tokens the reply may have",
        ),
    ],
)
async def test_bad_bodies_are_refused_in_the_apis_shape(
    rig: Rig, body: bytes, status: int, words: str
) -> None:
    got, answer, _ = await post(rig, body)
    assert got == status
    assert json.loads(answer)["error"]["message"] == words
    assert rig.upstream.requests == []


async def test_max_tokens_past_the_boxs_cap_is_refused(rig: Rig) -> None:
    status, body, _ = await post(rig, {**droid_request(), "max_tokens": 64_000})
    assert status == 400
    assert json.loads(body)["error"]["message"].startswith(
        "max_tokens is 64,000, over this box's cap of 32,000 output tokens a model request"
    )
    assert rig.upstream.requests == []


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "the model gateway does not pass the tool type 'web_search_20250305'",
        ),
        (
            {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]},
            "the model gateway does not pass the tool type 'web_fetch_20250910'",
        ),
        (
            {"tools": [{"type": "code_execution_20250825", "name": "code_execution"}]},
            "the model gateway does not pass the tool type 'code_execution_20250825'",
        ),
        (
            {"mcp_servers": [{"type": "url", "url": "https://evil.test/mcp", "name": "x"}]},
            "the model gateway does not pass the field 'mcp_servers': the MCP connector",
        ),
        ({"container": "container_1"}, "the model gateway does not pass the field 'container'"),
        ({"service_tier": "auto"}, "the model gateway passes service_tier only as"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "url", "url": "https://x.test/a.png"},
                            }
                        ],
                    }
                ]
            },
            "the model gateway does not pass an image whose source is 'url'",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [
                                    {"type": "document", "source": {"type": "file", "file_id": "f"}}
                                ],
                            }
                        ],
                    }
                ]
            },
            "the model gateway does not pass an document whose source is 'file'",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "container_upload", "file_id": "f"}]}
                ]
            },
            "the model gateway does not pass a content block of type 'container_upload'",
        ),
    ],
)
async def test_what_reaches_past_the_network_rules_or_is_unpriced_is_refused(
    rig: Rig, change: dict[str, Any], words: str
) -> None:
    """The attacker: a task with no hosts that has Anthropic's servers search, fetch, run code
    or reach an MCP server for it. Before, every one of these was forwarded as sent."""
    status, body, _ = await post(rig, {**droid_request(), **change})
    assert status == 400
    assert json.loads(body)["error"]["message"].startswith(words)
    assert rig.upstream.requests == []


async def test_a_beta_off_the_list_is_refused_by_name(rig: Rig) -> None:
    for beta in ("mcp-client-2025-04-04", "interleaved-thinking-2025-05-14, context-1m-2025-08-07"):
        status, body, _ = await post(
            rig, droid_request(), headers={**DROID_HEADERS, "anthropic-beta": beta}
        )
        assert status == 400
        assert json.loads(body)["error"]["message"].startswith(
            "the model gateway does not pass the beta "
        )
    assert rig.upstream.requests == []


async def test_a_long_conversation_fits(rig: Rig) -> None:
    long = droid_request("x" * (12 * 1024 * 1024))
    status, _, _ = await post(rig, long)
    assert status == 200
    assert rig.upstream.requests[0][1]["messages"] == long["messages"]


async def test_anything_but_messages_is_an_api_error(rig: Rig) -> None:
    status, body, _ = await post(rig, droid_request(), path="/v1/complete")
    assert status == 404
    assert json.loads(body) == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": "the model gateway serves POST /v1/messages (Anthropic's Messages API) "
            "only, not POST /v1/complete",
        },
    }


async def test_a_task_without_a_model_or_a_priced_model_is_refused(rig: Rig) -> None:
    rig.manager.task["model"] = None
    status, body, _ = await post(rig, droid_request())
    assert status == 400
    assert f"task {TASK} names no model" in json.loads(body)["error"]["message"]
    rig.manager.task["model"] = "claude-unknown-9"
    status, body, _ = await post(rig, droid_request())
    assert status == 400
    assert json.loads(body)["error"]["message"].startswith("unknown model claude-unknown-9")
    assert rig.upstream.requests == []


async def test_no_key_in_the_vault_is_said_and_nothing_forwarded(rig: Rig) -> None:
    gateway = ModelGateway(rig.manager, Waiter(rig.manager), rig.manager.task, 0.2, dict)
    status, body = await post_to(gateway, rig)
    assert status == 401
    assert json.loads(body)["error"]["message"] == (
        "this box has no model key: the owner adds one with `boxctl vault set ANTHROPIC_API_KEY`"
    )
    assert rig.upstream.requests == []


def test_stream_usage_reads_chunks_cut_anywhere() -> None:
    whole = b"".join(reply_events(USAGE)).replace(b"\n", b"\r\n")
    for size in (1, 2, 7, 64, len(whole)):
        usage = StreamUsage()
        for start in range(0, len(whole), size):
            usage.feed(whole[start : start + size])
        assert usage.tokens == Tokens(input=1200, output=345, cacheWrite=2000, cacheRead=48000)
        assert usage.final


def test_stream_usage_ignores_what_is_not_usage() -> None:
    usage = StreamUsage()
    assert usage.tokens is None
    text = json.dumps('"message_delta" "usage": {"output_tokens": 999999}')
    usage.feed(b"data: " + text.encode() + b"\n\n")
    usage.feed(b'data: {"type":"message_delta","usage":{"output_tokens":-5}}\n')
    usage.feed(b'data: {"type":"message_delta","usage":{"output_tokens":true}}\n')
    usage.feed(b"data: " + b"x" * (MAX_LINE + 10) + b'"message_delta"\n')
    assert usage.tokens is None
    usage.feed(b'data: {"type":"message_delta","usage":{"output_tokens":12}}\n')
    assert usage.tokens == Tokens(input=0, output=12)


def test_the_hour_cache_writes_are_read_and_priced_at_twice_the_input() -> None:
    usage = StreamUsage()
    written = {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 3000}
    start = {
        "type": "message",
        "usage": {
            "input_tokens": 10,
            "cache_creation_input_tokens": 4000,
            "cache_creation": written,
        },
    }
    usage.feed(sse("message_start", {"type": "message_start", "message": start}))
    assert usage.tokens == Tokens(input=10, output=0, cacheWrite=4000, cacheWrite1h=3000)
    assert usage.tokens is not None
    assert price_cents(MODEL, usage.tokens) == pytest.approx(
        (10 * 3 + 1000 * 3.75 + 3000 * 6) / 10_000
    )


def test_json_usage_reads_the_whole_reply() -> None:
    usage = JsonUsage()
    reply = json.dumps({"content": [{"type": "text", "text": "x" * 1000}], "usage": USAGE})
    usage.feed(reply[:10].encode())
    usage.feed(reply[10:].encode())
    assert not usage.final
    usage.finish()
    assert usage.tokens == Tokens(input=1200, output=345, cacheWrite=2000, cacheRead=48000)
    assert usage.final


async def test_requests_in_flight_are_capped(rig: Rig) -> None:
    """Each request may hold a 32 MiB body while it waits or streams: past MAX_IN_FLIGHT the
    gateway says so with a 429, which Droid retries, rather than wear the broker down."""
    release = asyncio.Event()
    rig.upstream.turns = [Turn(release=release) for _ in range(MAX_IN_FLIGHT)]
    async with aiohttp.ClientSession() as session:
        replies = [
            await session.post(f"{rig.url}/v1/messages", json=droid_request(str(n)))
            for n in range(MAX_IN_FLIGHT)
        ]
        status, body, _ = await post(rig, droid_request("one too many"))
        assert status == 429
        assert json.loads(body)["error"]["message"].startswith(
            f"this task has {MAX_IN_FLIGHT} model requests in flight"
        )
        release.set()
        for reply in replies:
            assert reply.status == 200
            await reply.read()
            reply.release()
    await rig.gateway.settled()
    assert (await post(rig, droid_request("now there is room")))[0] == 200


async def test_a_key_that_could_not_go_in_a_header_is_refused_unshown(rig: Rig) -> None:
    mangled = "sk-ant-first-line\r\nx-evil: 1"
    gateway = ModelGateway(
        rig.manager,
        Waiter(rig.manager),
        rig.manager.task,
        0.2,
        dict,
        read_key=lambda: ModelKey("ANTHROPIC_API_KEY", mangled),
    )
    assert mangled not in repr(ModelKey("ANTHROPIC_API_KEY", mangled))
    status, body = await post_to(gateway, rig)
    assert status == 401
    message = json.loads(body)["error"]["message"]
    assert message.startswith("the vault's ANTHROPIC_API_KEY is not a key")
    assert "sk-ant" not in message
    assert rig.upstream.requests == []


async def test_a_redirect_is_never_followed_so_the_key_goes_nowhere_else(rig: Rig) -> None:
    rig.upstream.turns = [Turn(status=307)]
    status, body, _ = await post(rig, droid_request())
    assert status == 502
    assert "redirect" in json.loads(body)["error"]["message"]
    # The one request the upstream saw was the first: the redirect's target got nothing.
    assert len(rig.upstream.requests) == 1


async def test_a_full_disk_is_an_error_droid_retries_in_the_box_s_words(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record cannot grow: nothing is forwarded or logged, and Droid sends it again later
    (529), rather than give up on a 500."""
    words = "The box's disk is full: boxd cannot add to its record until some space is freed."

    async def full(member: str, *args: str) -> Any:
        raise BoxError(Problem.FULL, words)

    monkeypatch.setattr(rig.manager, "call", full)
    status, body, _ = await post(rig, droid_request())
    assert status == 529
    assert json.loads(body)["error"] == {"type": "overloaded_error", "message": words}
    assert rig.upstream.requests == []


def test_what_the_counts_grew_by_never_gives_back_a_count_seen_lower() -> None:
    """A message_delta that says fewer input tokens than message_start did (no upstream should)
    is no refund: only what grew is charged again."""
    usage = StreamUsage()
    start = {"type": "message", "usage": {"input_tokens": 10, "output_tokens": 1}}
    usage.feed(sse("message_start", {"type": "message_start", "message": start}))
    assert usage.at_start == {"input": 10, "output": 1}
    delta = {"type": "message_delta", "usage": {"input_tokens": 4, "output_tokens": 50}}
    usage.feed(sse("message_delta", delta))
    assert usage.at_start == {"input": 10, "output": 1}
    assert usage.since(usage.at_start) == {"output": 49}


async def test_bodies_are_held_only_in_the_places_requests_have(rig: Rig) -> None:
    """The attacker's many connections, each saying a 32 MiB body is coming and sending one
    byte of it: before, each had its 32 MiB made ready as its head arrived, and twenty took the
    broker past its MemoryMax. Now a body is read only in one of MAX_IN_FLIGHT places: the
    connections past them are told so at once, their bodies never read."""
    head = (
        "POST /v1/messages HTTP/1.1\r\nHost: box\r\ncontent-type: application/json\r\n"
        f"content-length: {MAX_REQUEST}\r\n\r\n{{"
    ).encode()
    # Served as the broker serves it: behind the connection guard, which reads a body whole
    # before the handler runs.
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.bind(("127.0.0.1", 0))
    listening.listen(64)
    port = listening.getsockname()[1]
    await rig.gateway.serve(listening)
    rig.url = f"http://127.0.0.1:{port}"
    held = []
    for _ in range(MAX_IN_FLIGHT):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        held.append((reader, writer))
    await asyncio.sleep(0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    answer = await asyncio.wait_for(reader.read(4096), 5)
    assert answer.startswith(b"HTTP/1.1 429"), answer[:100]
    assert f"this task has {MAX_IN_FLIGHT} model requests in flight".encode() in answer
    writer.close()
    for _, held_writer in held:
        held_writer.close()
    await rig.manager.until(lambda: rig.gateway._places.taken == 0)
    assert (await post(rig, droid_request("room again")))[0] == 200


async def test_a_request_sent_that_gets_no_answer_is_charged_and_spends_its_yes(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attacker's request whose whole reply takes longer than the gateway waits for its
    head: before, no status meant an error, so nothing was charged and the owner's yes could
    send it again and again. Now a request that went upstream and got no answer is charged the
    most it could cost, and its yes is spent."""
    monkeypatch.setattr(
        model_exchange, "UPSTREAM_TIMEOUT", aiohttp.ClientTimeout(total=None, sock_read=0.3)
    )
    await rig.manager.set_task(costCents=1000.0)
    assert (await post(rig, droid_request(stream=False)))[0] == 529
    (asked,) = await rig.manager.asked()
    await rig.manager.answer(asked, True)
    hold = asyncio.Event()
    rig.upstream.turns = [Turn(stream=False, hold=hold)]
    status, body, _ = await post(rig, droid_request(stream=False))
    assert status == 503, body
    await rig.gateway.settled()
    (charged,) = await rig.manager.costs()
    reserve = worst_case(droid_request(stream=False))
    assert (charged["cents"], charged["reserved"]) == (pytest.approx(reserve), True)
    # The same bytes again: that yes went with the first.
    assert (await post(rig, droid_request(stream=False)))[0] == 529
    assert len(rig.upstream.requests) == 1
    hold.set()
