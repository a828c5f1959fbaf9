"""The task's model gateway: Anthropic's Messages API, served by the broker on the socket systemd
binds at 127.0.0.1:3130 in the task's network namespace (units/box-model@.socket), so the model
key never enters the sandbox. This is its HTTP handler; each part of the way is a module of its
own.

For each `POST /v1/messages` it:
- takes one of the task's places for requests in flight (boxd.broker.model.in_flight), before
  the body is read;
- reads the body with bounded memory (boxd.broker.model.body) and checks it against the
  allowlists of what a client model request needs (boxd.broker.model.request, allowlist):
  refused in words that name what, in the API's error shape (boxd.broker.model.messages_api);
- drops whatever key or authorization the worker sent and adds the vault's model key
  (boxd.broker.model.key, boxd.wire.model_key), which only the broker can read;
- runs the request on the task's model, whatever model it names;
- reserves the request's worst case with the manager before it goes (`BeginModelRequest`: an
  estimate of its input plus `max_tokens` at the output price, counted with every other request
  and call in flight), and asks the owner first when that would take the task past its budget.
  One yes lets one request through: once a request under it is answered 200 it is spent
  (Droid's retries of a request that got no 200 go again under it); no answer in time is a 529
  that Droid retries;
- hands it to its exchange with the upstream (boxd.broker.model.exchange: settings'
  modelBaseUrl, its address screened by boxd.broker.model.upstream, whatever the task's hosts
  say), a job of its own that passes the reply back as it arrives, chunk by chunk, and reads on
  to the end once the worker has hung up; the broker is busy, never idle, while one is open;
- has every reply the upstream delivers metered and its cost told to the manager
  (boxd.broker.model.cost_reports, priced by boxd.manager.model_requests), whatever the worker
  does with its connection; a reply that ends without its final usage is charged what was
  reserved for it, and so is one a broker killed mid-way left open;
- tells the manager when the upstream refuses the key (401): the task ends failed, saying so.

Nothing here logs a request's headers or the key.
"""

import asyncio
import hashlib
import json
import secrets
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import web

from boxd.broker.manager_link import Manager, Waiter
from boxd.broker.model.allowlist import Refused
from boxd.broker.model.body import LARGE_BODY, MAX_REQUEST, TooLarge, keep_body, read_body
from boxd.broker.model.cost_reports import CostReports
from boxd.broker.model.exchange import Upstream
from boxd.broker.model.in_flight import InFlight
from boxd.broker.model.key import ModelKey, usable, vault_model_key
from boxd.broker.model.messages_api import (
    MESSAGES,
    RETRY_LATER,
    api_error,
    api_error_words,
    api_errors,
    too_large,
)
from boxd.broker.model.request import (
    ModelRequest,
    NotAnObject,
    TooDense,
    read_request,
)
from boxd.dbus import interface as api
from boxd.doors.connection_guard import Guard
from boxd.doors.connection_limits import MODEL_GATEWAY_CONNECTIONS, Bounds
from boxd.errors import BoxError, Problem
from boxd.wire.approval import ApprovalState
from boxd.wire.pricing import price_of

# A broker told to stop lets the replies being read finish for this long (as calls do:
# boxd/broker/calls.py), then cuts them off and has them charged what was reserved.
FINISH_SECONDS = 30.0


class ModelGateway:
    def __init__(
        self,
        manager: Manager,
        waiter: Waiter,
        task: dict[str, Any],
        wait_seconds: float,
        in_flight: Callable[[], dict[str, float]],
        *,
        read_key: Callable[[], ModelKey | None] = vault_model_key,
    ) -> None:
        self._manager = manager
        self._waiter = waiter
        self._task = task
        self._wait_seconds = wait_seconds
        self._in_flight = in_flight
        self._read_key = read_key
        self._key: ModelKey | None = None
        self._guards: list[Guard] = []
        # One body is checked at a time: checking takes memory in proportion to it.
        self._checking = asyncio.Lock()
        self._places = InFlight()
        self._reports = CostReports(manager)
        self._upstream = Upstream(manager, self._reports)

    def app(self) -> web.Application:
        # The place is taken before the body is read (the connection guard reads it whole,
        # after these).
        app = web.Application(
            middlewares=[api_errors, self._places.place], client_max_size=MAX_REQUEST
        )
        app.router.add_post(MESSAGES, self.messages)
        return app

    async def serve(self, sock: socket.socket) -> None:
        """Serves the gateway on an already-listening socket (the one systemd passes)."""
        guard = Guard(
            self.app(), Bounds(MODEL_GATEWAY_CONNECTIONS), api_error_words, read_body=keep_body
        )
        await guard.start([sock])
        self._guards.append(guard)

    def resting(self) -> set[int]:
        """The descriptors of keep-alive connections at rest (boxd/broker/idle.py)."""
        return set[int]().union(*(guard.resting() for guard in self._guards))

    def busy(self) -> bool:
        """Whether an upstream request is still open, or a reply's cost still being logged:
        the worker that sent it may have hung up long since."""
        return bool(self._places.exchanges or self._reports.pending)

    async def close(self) -> None:
        """Lets the replies being read finish for FINISH_SECONDS, then cuts them off (each is
        then charged what was reserved for it), and waits for every cost to be logged."""
        for guard in self._guards:
            await guard.close()
        await self._places.finish(FINISH_SECONDS)
        await self.settled()
        await self._upstream.close()

    async def settled(self) -> None:
        """Waits until every exchange is over and its cost logged (for tests and the bench)."""
        exchanges, reports = self._places.exchanges, self._reports.pending
        while exchanges or reports:
            await asyncio.gather(*exchanges, *reports, return_exceptions=True)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        outcome = await self._message(request)
        if isinstance(outcome, asyncio.Task):
            self._places.hand_over(request, outcome)
            # Shielded: a handler cancelled as its worker goes leaves the exchange running.
            return await asyncio.shield(outcome)
        return outcome

    async def _message(
        self, request: web.Request
    ) -> "web.StreamResponse | asyncio.Task[web.StreamResponse]":
        try:
            body = await read_body(request)
        except TooLarge:
            return too_large()
        model = self._model()
        try:
            checked = await self._check(body, model, request.headers.get("anthropic-beta"))
        except Refused as refused:
            return api_error(400, f"{refused}", retry=False)
        except TooDense as dense:
            return api_error(413, f"{dense}: the model gateway refuses it", retry=False)
        except NotAnObject:
            return api_error(400, "the request body must be a JSON object: a Messages API request")
        except (ValueError, RecursionError):
            return api_error(400, "the request body is not JSON: send a Messages API request")
        key = await self._model_key()
        digest = hashlib.sha256(body).hexdigest()
        request_id = secrets.token_hex(8)
        begun = await self._begin(request_id, digest, checked)
        if isinstance(begun, web.Response):
            return begun
        return asyncio.create_task(
            self._upstream.exchange(request, request_id, str(begun["upstream"]), checked, key)
        )

    async def _check(self, body: bytearray, model: str, beta: str | None) -> ModelRequest:
        if len(body) <= LARGE_BODY:
            return read_request(body, model, beta)
        # A large body is checked in a thread, one at a time, so the loop goes on serving the
        # replies that stream meanwhile.
        async with self._checking:
            return await asyncio.to_thread(read_request, body, model, beta)

    def _model(self) -> str:
        model = self._task.get("model")
        if not model:
            raise BoxError(
                Problem.INVALID,
                f"task {self._task['id']} names no model, so it has none to reach: start it "
                "with model (haiku, sonnet, opus or a full id like claude-sonnet-4-6)",
            )
        # A model the box cannot price would run unmetered: refused before anything is spent.
        price_of(str(model))
        return str(model)

    async def _model_key(self) -> ModelKey:
        if self._key is None:
            self._key = await asyncio.to_thread(self._read_key)
        return usable(self._key)

    async def _begin(
        self, request_id: str, digest: str, checked: ModelRequest
    ) -> dict[str, Any] | web.Response:
        """The manager's word on the request: admitted, with its worst case reserved, or the
        owner's answer (asked for now, or earlier for the same bytes) as a refusal: a 529 that
        Droid sends again while it waits, a 403 once denied."""
        start = json.dumps(
            {
                "request": request_id,
                "requestHash": digest,
                "inputTokens": checked.input_tokens,
                "maxTokens": checked.max_tokens,
                "hourCache": checked.hour_cache,
                "inFlight": self._in_flight(),
            }
        )
        await self._reports.delivered()
        begun: dict[str, Any] = await self._manager.call(api.BEGIN_MODEL_REQUEST, start)
        if begun.get("admitted"):
            return begun
        approval = begun["approval"]
        state = await self._waiter.wait(approval, self._wait_seconds)
        limit = begun.get("budgetCents")
        over = f"task {self._task['id']} has reached its budget of {limit:g} cents"
        if state == ApprovalState.APPROVED:
            begun = await self._manager.call(api.BEGIN_MODEL_REQUEST, start)
            if begun.get("admitted"):
                return begun
            if begun.get("taken"):
                return api_error(
                    RETRY_LATER,
                    "The box owner's OK for this request is being used by the same request, "
                    "sent before this one and not yet answered: send it again to check.",
                    retry=True,
                )
            state = begun["approval"]["state"]
        if state == ApprovalState.DENIED:
            return api_error(
                403,
                f"The box owner did not approve more spending on the model: {over}.",
                retry=False,
            )
        return api_error(
            RETRY_LATER,
            f"Waiting for the box owner to approve more spending on the model: {over}. "
            "Send the request again to check.",
            retry=True,
        )
