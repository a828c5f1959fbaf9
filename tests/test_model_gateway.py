"""The model gateway in the broker, between a client speaking Anthropic's Messages API and a
fake upstream (a real aiohttp server on 127.0.0.1), with the manager's side in memory. The real
manager, D-Bus, systemd and the task's namespace are in tests/vm/test_model_gateway.py."""

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from boxd.broker.model_gateway import MAX_IN_FLIGHT, MAX_REQUEST, ModelGateway, ModelKey
from boxd.broker.model_request import NotAnObject, with_model
from boxd.broker.model_usage import MAX_LINE, JsonUsage, StreamUsage
from boxd.errors import BoxError, Problem
from boxd.key_use import ModelUse, QuestionUse, Use, first_refusal
from boxd.model_key import KEY_REFUSED
from boxd.pricing import Tokens, price_cents

KEY = "sk-ant-api03-the-owners-own-key"
MODEL = "claude-sonnet-4-6"
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


class Upstream:
    """A stand-in for Anthropic's API: answers scripted turns and keeps every request."""

    def __init__(self) -> None:
        self.turns: list[Turn] = []
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self.messages)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(({k.lower(): v for k, v in request.headers.items()}, body))
        turn = self.turns.pop(0) if self.turns else Turn()
        if 300 <= turn.status < 400:
            raise web.HTTPTemporaryRedirect(f"{self.url}/v1/messages?stolen=1")
        if turn.status != 200:
            error = {"type": "error", "error": {"type": "x", "message": "invalid x-api-key"}}
            return web.json_response(error, status=turn.status)
        if not turn.stream:
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
    """The manager's side of the gateway, in memory, with its key rule (boxd.key_use)."""

    def __init__(self, upstream: str, budget: float = 100) -> None:
        self.task: dict[str, Any] = {
            "id": "t000000001",
            "model": MODEL,
            "budgetCents": budget,
            "costCents": 0.0,
        }
        self.upstream = upstream
        self.reserved: dict[str, float] = {}
        self.approvals: dict[str, dict[str, Any]] = {}
        self.uses: dict[str, Use] = {}
        self.asked: list[dict[str, Any]] = []
        self.costs: list[dict[str, Any]] = []
        self.refused = 0
        self.answers: dict[str, asyncio.Future[str]] = {}
        # How often the gateway began waiting for an answer.
        self.waits = 0
        self._news = asyncio.Event()

    async def until(self, check: Callable[[], bool]) -> None:
        """Waits until `check` holds, looking again after each thing the gateway does."""
        while not check():
            self._news.clear()
            await asyncio.wait_for(self._news.wait(), 5)

    def tell(self) -> None:
        self._news.set()

    async def call(self, member: str, *args: str) -> Any:
        try:
            return await self._call(member, *args)
        finally:
            self.tell()

    async def _call(self, member: str, *args: str) -> Any:
        if member == "ModelKeyRefused":
            self.refused += 1
            return self.task
        data = json.loads(args[0])
        if member == "BeginModelRequest":
            self._claim(data["key"], ModelUse(data["requestHash"]))
            return {
                "spentCents": self.task["costCents"],
                "reservedCents": self.reserved,
                "approval": self.approvals.get(data["key"]),
                "upstream": self.upstream,
            }
        if member == "Ask":
            use = ModelUse(data["inputHash"]) if "model" in data else QuestionUse(data["question"])
            self._claim(data["key"], use)
            self.asked.append(data)
            return self.approvals.setdefault(
                data["key"], {"id": f"t000000001.{data['key']}", "state": "pending", **data}
            )
        assert member == "LogCost"
        self.costs.append(data)
        self.task["costCents"] += data["cents"]
        return {"kind": "cost", "data": data}

    def _claim(self, key: str, use: Use) -> None:
        taken = self.uses.setdefault(key, use)
        why = first_refusal(key, (taken,), use)
        if why is not None:
            raise BoxError(Problem.INVALID, why)

    def answer(self, key: str, state: str) -> None:
        self.approvals[key]["state"] = state
        self.answers.setdefault(key, asyncio.get_running_loop().create_future()).set_result(state)


class Waiter:
    def __init__(self, manager: Manager) -> None:
        self.manager = manager

    async def wait(self, approval: dict[str, Any], seconds: float) -> str:
        if approval["state"] != "pending":
            return str(approval["state"])
        key = approval["key"]
        answer = self.manager.answers.setdefault(key, asyncio.get_running_loop().create_future())
        self.manager.waits += 1
        self.manager.tell()
        try:
            return await asyncio.wait_for(asyncio.shield(answer), seconds)
        except TimeoutError:
            return "pending"


@dataclass
class Rig:
    url: str
    upstream: Upstream
    manager: Manager
    gateway: ModelGateway
    in_flight: dict[str, float]


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    upstream = Upstream()
    await upstream.start()
    manager = Manager(upstream.url)
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
        "system": [{"type": "text", "text": "You are Droid."}],
        "thinking": {"type": "adaptive"},
        "stream": stream,
    }


DROID_HEADERS = {
    "x-api-key": "x",
    "authorization": "Bearer stolen",
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "interleaved-thinking-2025-05-14",
    "user-agent": "factory-cli/0.225.2",
    "cookie": "session=1",
}


async def post(
    rig: Rig, body: dict[str, Any] | bytes, path: str = "/v1/messages"
) -> tuple[int, bytes, dict[str, str]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{rig.url}{path}", data=data, headers=DROID_HEADERS) as reply,
    ):
        return reply.status, await reply.read(), dict(reply.headers)


def expected_cost(usage: dict[str, int]) -> dict[str, Any]:
    tokens = Tokens(
        input=usage["input_tokens"],
        output=usage["output_tokens"],
        cacheWrite=usage["cache_creation_input_tokens"],
        cacheRead=usage["cache_read_input_tokens"],
    )
    return {
        "cents": price_cents(MODEL, tokens),
        "what": "model",
        "model": MODEL,
        "tokens": tokens.json(),
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
    assert rig.manager.costs == streamed_costs(USAGE)
    assert sum(cost["cents"] for cost in rig.manager.costs) == pytest.approx(
        expected_cost(USAGE)["cents"], rel=0, abs=1e-9
    )


async def test_a_factory_key_goes_as_key_and_bearer(rig: Rig) -> None:
    gateway = ModelGateway(
        rig.manager,
        Waiter(rig.manager),
        rig.manager.task,
        0.2,
        dict,
        read_key=lambda: ModelKey("FACTORY_API_KEY", "fk-owner"),
    )
    runner = web.AppRunner(gateway.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    rig.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        assert (await post(rig, droid_request()))[0] == 200
    finally:
        await runner.cleanup()
        await gateway.close()
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
        # What message_start said is logged already: a broker killed now would lose at most
        # the output tokens still to come.
        await rig.manager.until(lambda: bool(rig.manager.costs))
        assert rig.manager.costs == streamed_costs(USAGE)[:1]
        release.set()
        rest = await reply.read()
    assert first + rest == b"".join(events)
    await rig.gateway.settled()
    assert rig.manager.costs == streamed_costs(USAGE)


async def test_a_non_streamed_reply_is_metered_from_its_usage(rig: Rig) -> None:
    usage = {**USAGE, "output_tokens": 7}
    rig.upstream.turns = [Turn(stream=False, usage=usage)]
    status, body, _ = await post(rig, droid_request(stream=False))
    assert status == 200
    assert json.loads(body)["usage"] == usage
    await rig.gateway.settled()
    assert rig.manager.costs == [expected_cost(usage)]


async def test_a_reply_cut_off_logs_the_usage_it_had_said(rig: Rig) -> None:
    """The upstream hangs up after message_start: the input and cache tokens it reported are
    charged, and the one output token message_start counted."""
    rig.upstream.turns = [Turn(cut_after=3)]
    with contextlib.suppress(aiohttp.ClientPayloadError):
        await post(rig, droid_request())
    await rig.gateway.settled()
    assert rig.manager.costs == [expected_cost({**USAGE, "output_tokens": 1})]


async def test_a_worker_that_hangs_up_still_pays_for_what_came(rig: Rig) -> None:
    release = asyncio.Event()
    rig.upstream.turns = [Turn(release=release)]
    async with aiohttp.ClientSession() as session:
        reply = await session.post(f"{rig.url}/v1/messages", json=droid_request())
        await asyncio.wait_for(reply.content.readany(), 5)
        reply.close()
    release.set()
    await rig.manager.until(lambda: bool(rig.manager.costs))
    (cost,) = rig.manager.costs
    assert cost["tokens"]["input"] == USAGE["input_tokens"]
    assert cost["tokens"]["cacheRead"] == USAGE["cache_read_input_tokens"]


async def test_over_budget_asks_first_and_approved_goes(rig: Rig) -> None:
    rig.manager.task["costCents"] = 100.0
    asking = asyncio.create_task(post(rig, droid_request()))
    await rig.manager.until(lambda: rig.manager.waits == 1)
    (asked,) = rig.manager.asked
    digest = hashlib.sha256(json.dumps(droid_request()).encode()).hexdigest()
    assert asked["key"] == f"model.{digest}"
    assert (asked["model"], asked["inputHash"]) == (MODEL, digest)
    assert asked["question"] == (
        f"Let task t000000001 ask its model ({MODEL}) once more? It has spent 100 cents, which "
        "reaches its budget of 100 cents; what the answer costs is known only once it comes."
    )
    assert rig.upstream.requests == []
    rig.manager.answer(asked["key"], "approved")
    status, _, _ = await asking
    assert status == 200
    assert len(rig.upstream.requests) == 1


async def test_calls_in_flight_count_toward_the_budget(rig: Rig) -> None:
    rig.manager.task["costCents"] = 60.0
    rig.manager.reserved = {"line-3": 25.0}
    rig.in_flight["line-4"] = 15.0
    status, _, _ = await post(rig, droid_request())
    assert status == 529
    (asked,) = rig.manager.asked
    assert (
        "It has spent 60 cents (and 40 cents more for calls not yet finished)"
        in (asked["question"])
    )
    rig.in_flight.clear()
    status, _, _ = await post(rig, droid_request("another"))
    assert status == 200


async def test_denied_is_never_forwarded(rig: Rig) -> None:
    rig.manager.task["costCents"] = 150.0
    asking = asyncio.create_task(post(rig, droid_request()))
    await rig.manager.until(lambda: rig.manager.waits == 1)
    rig.manager.answer(rig.manager.asked[0]["key"], "denied")
    status, body, headers = await asking
    assert status == 403
    assert headers["x-should-retry"] == "false"
    assert json.loads(body) == {
        "type": "error",
        "error": {
            "type": "permission_error",
            "message": "The box owner did not approve more spending on the model: task "
            "t000000001 has reached its budget of 100 cents.",
        },
    }
    assert rig.upstream.requests == []


async def test_pending_is_an_error_droid_retries_and_the_retry_keeps_the_approval(
    rig: Rig,
) -> None:
    rig.manager.task["costCents"] = 100.0
    status, body, headers = await post(rig, droid_request())
    assert status == 529
    assert headers["x-should-retry"] == "true"
    error = json.loads(body)["error"]
    assert error["type"] == "overloaded_error"
    assert error["message"] == (
        "Waiting for the box owner to approve more spending on the model: task t000000001 has "
        "reached its budget of 100 cents. Send the request again to check."
    )
    assert rig.upstream.requests == []
    # Droid sends the same request again: the same approval, not a second question.
    retry = asyncio.create_task(post(rig, droid_request()))
    await rig.manager.until(lambda: rig.manager.waits == 2)
    (asked,) = rig.manager.asked
    rig.manager.answer(asked["key"], "approved")
    assert (await retry)[0] == 200
    assert len(rig.manager.asked) == 1
    # Another request past the budget is asked about on its own.
    assert (await post(rig, droid_request("and now?")))[0] == 529
    assert len(rig.manager.asked) == 2


async def test_a_request_that_asked_waits_for_its_answer_even_if_it_fits_now(rig: Rig) -> None:
    rig.manager.task["costCents"] = 100.0
    assert (await post(rig, droid_request()))[0] == 529
    rig.manager.task["costCents"] = 0.0
    assert (await post(rig, droid_request()))[0] == 529
    assert rig.upstream.requests == []


async def test_medium_autonomy_caps_the_budget_at_a_dollar(rig: Rig) -> None:
    rig.manager.task.update(budgetCents=500, costCents=100.0, droid={"autonomy": "medium"})
    assert (await post(rig, droid_request()))[0] == 529
    assert "its budget of 100 cents" in rig.manager.asked[0]["question"]


async def test_a_refused_key_is_reported_and_the_worker_told(rig: Rig) -> None:
    rig.upstream.turns = [Turn(status=401)]
    status, body, _ = await post(rig, droid_request())
    assert status == 401
    assert json.loads(body)["error"] == {"type": "authentication_error", "message": KEY_REFUSED}
    assert rig.manager.refused == 1
    assert rig.manager.costs == []


async def test_other_upstream_errors_pass_through_uncharged(rig: Rig) -> None:
    rig.upstream.turns = [Turn(status=529)]
    status, body, _ = await post(rig, droid_request())
    assert status == 529
    assert json.loads(body)["type"] == "error"
    assert rig.manager.refused == 0
    await rig.gateway.settled()
    assert rig.manager.costs == []


async def test_an_upstream_that_is_not_there_is_a_retry(rig: Rig) -> None:
    await rig.upstream.stop()
    status, body, _ = await post(rig, droid_request())
    assert status == 503
    assert json.loads(body)["error"]["message"].startswith(
        f"the model at {rig.upstream.url} could not be reached"
    )


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "the request body is not JSON: send a Messages API request"),
        (b"[1, 2]", 400, "the request body must be a JSON object: a Messages API request"),
        (b"[" * 100_000, 400, "the request body is not JSON: send a Messages API request"),
        (
            b"x" * (MAX_REQUEST + 1),
            413,
            "the request body is over 32 MiB, more than the model gateway takes",
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
    assert "task t000000001 names no model" in json.loads(body)["error"]["message"]
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


def test_json_usage_reads_the_whole_reply() -> None:
    usage = JsonUsage()
    reply = json.dumps({"content": [{"type": "text", "text": "x" * 1000}], "usage": USAGE})
    usage.feed(reply[:10].encode())
    usage.feed(reply[10:].encode())
    usage.finish()
    assert usage.tokens == Tokens(input=1200, output=345, cacheWrite=2000, cacheRead=48000)


@pytest.mark.parametrize(
    "body",
    [
        '{"model":"claude-opus-4-6","messages":[{"role":"user","content":"hi"}]}',
        ' {\n "messages" : [] ,\n "model" : "x" , "stream":true }\n',
        '{"messages":[],"stream":false}',
        "{}",
        " { } ",
        '{"model":{"nested":["claude"]},"m\\u006fdel":"sneaky","model":"twice"}',
        '{"messages":[{"content":"\\"model\\": \\"opus\\""}],"model":"a"}',
        '{"model":null,"é":"ü"}',
    ],
)
def test_the_model_is_spliced_in_and_nothing_else_changes(body: str) -> None:
    spliced = with_model(body.encode(), MODEL)
    assert json.loads(spliced) == {**json.loads(body), "model": MODEL}
    # Read the way a reader that keeps the first of twice-named keys would: still ours.
    firsts = json.loads(spliced, object_pairs_hook=lambda pairs: dict(reversed(pairs)))
    assert firsts["model"] == MODEL


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"[1, 2]", NotAnObject),
        (b'"model"', NotAnObject),
        (b"{not json", ValueError),
        (b'{"model":"a",}', ValueError),
        (b'{"model":"a"} {}', ValueError),
        (b'{"model" "a"}', ValueError),
        (b'{"a":1', ValueError),
        (b"", ValueError),
        (b"\xff{}", ValueError),
        (b'{"a":' + b"[" * 100_000 + b"}", RecursionError),
    ],
)
def test_what_is_not_a_json_object_is_refused(body: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        with_model(body, MODEL)


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

    monkeypatch.setattr(rig.manager, "_call", full)
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
