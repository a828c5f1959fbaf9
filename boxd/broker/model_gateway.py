"""The task's model gateway: Anthropic's Messages API, served by the broker on the socket systemd
binds at 127.0.0.1:3130 in the task's network namespace (units/box-model@.socket), so the model
key never enters the sandbox.

For each `POST /v1/messages` it:
- drops whatever key or authorization the worker sent and adds the vault's model key
  (boxd.model_key), which only the broker can read;
- runs the request on the task's model, whatever model it names;
- asks the owner first when the task's spending (its calls in flight included) has reached its
  budget: the approval's key is `model.<sha256 of the body>`, so Droid sending the same request
  again finds the same approval; no answer in time is a 529 that Droid retries;
- forwards it to the upstream (settings' modelBaseUrl), whatever the task's hosts say, and
  passes the reply back as it arrives, chunk by chunk;
- logs the cost of each reply from the usage the reply reported (all of it, or as much as came
  before the reply was cut off), priced like the broker's `/usage`: a streamed reply's in two
  cost events, what `message_start` said (the input and cache tokens) as soon as it has passed,
  and the rest once the reply ends, so a broker killed mid-reply loses at most the output
  tokens since (boxd.broker.model_usage);
- tells the manager when the upstream refuses the key (401): the task ends failed, saying so.

Nothing here logs a request's headers or the key.
"""

import asyncio
import hashlib
import json
import logging
import re
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from boxd.approval import ApprovalState
from boxd.broker.budget import budget_cents
from boxd.broker.credentials import read_secrets
from boxd.broker.manager_link import Manager, Waiter
from boxd.broker.model_request import NotAnObject, with_model
from boxd.broker.model_usage import JsonUsage, StreamUsage, tokens_of
from boxd.connection_guard import Guard
from boxd.connection_limits import MODEL_GATEWAY_CONNECTIONS, Bounds
from boxd.errors import BoxError, Problem
from boxd.model_key import ANTHROPIC_KEY, KEY_NAMES, KEY_REFUSED
from boxd.pricing import price_cents, price_of

log = logging.getLogger(__name__)

MESSAGES = "/v1/messages"
# A long Droid conversation is resent whole each turn: hundreds of thousands of tokens of text,
# tool results and images, base64. Anthropic's own limit for a Messages request is 32 MB.
MAX_REQUEST = 32 * 1024 * 1024
MAX_REQUEST_WORDS = "32 MiB"
# Model requests one task has in flight at once (read, waiting for the owner, or streaming):
# Droid sends one at a time, a few with subagents. Each may hold a 32 MiB body while it runs,
# and the broker has 512 MiB (box-broker@.service MemoryMax=).
MAX_IN_FLIGHT = 8
DEFAULT_VERSION = "2023-06-01"
# Request headers the upstream gets from the worker's request; nothing else of it passes (no
# key, no authorization, no cookie), and the gateway adds the key.
PASSED_REQUEST = ("anthropic-version", "anthropic-beta")
# Reply headers the worker gets from the upstream's reply.
PASSED_REPLY = ("content-type", "request-id", "retry-after", "x-should-retry")
PASSED_REPLY_PREFIX = "anthropic-ratelimit-"
# The status Droid 0.225.2 retries, with its own backoff (about 5 s, 14 s, then every 33 s,
# nine times over some four minutes, before it gives up), as it does 500, 503 and 429. A 401
# or 403 it does not retry: the `droid exec` fails at once.
RETRY_LATER = 529
UPSTREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=30, sock_connect=30, sock_read=600)

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def api_error(status: int, message: str, *, retry: bool | None = None) -> web.Response:
    """An error in the shape Anthropic's API (and so Droid) reads, in plain words."""
    kind = _ERROR_TYPES.get(status, "api_error")
    headers = {} if retry is None else {"x-should-retry": "true" if retry else "false"}
    return web.json_response(
        {"type": "error", "error": {"type": kind, "message": message}},
        status=status,
        headers=headers,
    )


def api_error_words(message: str, status: int) -> web.Response:
    """api_error as the connection guard calls it, for what it answers itself (408, 503)."""
    return api_error(status, message)


# What a key is made of: printable ASCII, no spaces. Anything else could not go in a header
# (and aiohttp's complaint would not be in the owner's words).
_KEY_CHARACTERS = re.compile(r"[!-~]+")


@dataclass(frozen=True)
class ModelKey:
    name: str
    # Never shown: not in a repr, a log line or an error.
    value: str = field(repr=False)

    def headers(self) -> dict[str, str]:
        """Anthropic's API reads x-api-key; a Factory key also goes as a bearer token, the way
        Factory's own endpoints take it."""
        if self.name == ANTHROPIC_KEY:
            return {"x-api-key": self.value}
        return {"x-api-key": self.value, "authorization": f"Bearer {self.value}"}


def vault_model_key() -> ModelKey | None:
    """The first of the model keys the vault holds, as systemd gave them to this broker."""
    secrets = read_secrets(KEY_NAMES)
    for name in KEY_NAMES:
        if secrets.get(name):
            return ModelKey(name, secrets[name].strip())
    return None


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
        self._session: aiohttp.ClientSession | None = None
        self._guards: list[Guard] = []
        self._requests = 0
        # Cost events being logged: kept so a reply whose worker hung up still logs its cost.
        self._logging: set[asyncio.Task[None]] = set()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_api_errors], client_max_size=MAX_REQUEST)
        app.router.add_post(MESSAGES, self.messages)
        return app

    async def serve(self, sock: socket.socket) -> None:
        """Serves the gateway on an already-listening socket (the one systemd passes)."""
        guard = Guard(self.app(), Bounds(MODEL_GATEWAY_CONNECTIONS), api_error_words)
        await guard.start([sock])
        self._guards.append(guard)

    def resting(self) -> set[int]:
        """The descriptors of keep-alive connections at rest (boxd/broker/idle.py)."""
        return set[int]().union(*(guard.resting() for guard in self._guards))

    def busy(self) -> bool:
        """Whether a reply's cost is still being logged (its worker may have hung up)."""
        return bool(self._logging)

    async def close(self) -> None:
        for guard in self._guards:
            await guard.close()
        if self._logging:
            await asyncio.gather(*self._logging, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def messages(self, request: web.Request) -> web.StreamResponse:
        if self._requests >= MAX_IN_FLIGHT:
            return api_error(
                429,
                f"this task has {MAX_IN_FLIGHT} model requests in flight, the most the model "
                "gateway takes at once: send this one again when one has finished",
            )
        self._requests += 1
        try:
            return await self._message(request)
        finally:
            self._requests -= 1

    async def _message(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        model = self._model()
        try:
            forwarded = with_model(body, model)
        except NotAnObject:
            return api_error(400, "the request body must be a JSON object: a Messages API request")
        except (ValueError, RecursionError):
            return api_error(400, "the request body is not JSON: send a Messages API request")
        key = await self._model_key()
        digest = hashlib.sha256(body).hexdigest()
        # Only the spliced copy is kept while the request waits and streams.
        del body
        approval_key = f"model.{digest}"
        begun = await self._manager.call(
            "BeginModelRequest", json.dumps({"key": approval_key, "requestHash": digest})
        )
        held = await self._hold(begun, approval_key, digest, model)
        if held is not None:
            return held
        return await self._forward(request, str(begun["upstream"]), forwarded, key, model)

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
        if self._key is None:
            raise BoxError(
                Problem.UNAUTHORIZED,
                f"this box has no model key: the owner adds one with `boxctl vault set "
                f"{ANTHROPIC_KEY}`",
            )
        if not _KEY_CHARACTERS.fullmatch(self._key.value):
            raise BoxError(
                Problem.UNAUTHORIZED,
                f"the vault's {self._key.name} is not a key: it holds spaces, line breaks or "
                f"other characters no key has; the owner sets it again with `boxctl vault set "
                f"{self._key.name}`",
            )
        return self._key

    async def _hold(
        self, begun: dict[str, Any], key: str, digest: str, model: str
    ) -> web.Response | None:
        """Asks the owner first once the task's spending has reached its budget; None when the
        request may go. A request that asked once waits for that answer, even if it fits now."""
        spent = float(begun["spentCents"])
        reserved = sum(float(c) for c in {**begun["reservedCents"], **self._in_flight()}.values())
        limit = budget_cents(self._task)
        approval = begun["approval"]
        if approval is None and spent + reserved >= limit:
            question = self._question(spent, reserved, limit, model)
            approval = await self._manager.call(
                "Ask",
                json.dumps({"key": key, "question": question, "model": model, "inputHash": digest}),
            )
        if approval is None:
            return None
        state = await self._waiter.wait(approval, self._wait_seconds)
        over = f"task {self._task['id']} has reached its budget of {limit:g} cents"
        if state == ApprovalState.PENDING:
            return api_error(
                RETRY_LATER,
                f"Waiting for the box owner to approve more spending on the model: {over}. "
                "Send the request again to check.",
                retry=True,
            )
        if state == ApprovalState.DENIED:
            return api_error(
                403,
                f"The box owner did not approve more spending on the model: {over}.",
                retry=False,
            )
        return None

    def _question(self, spent: float, reserved: float, limit: float, model: str) -> str:
        waiting = f" (and {reserved:g} cents more for calls not yet finished)" if reserved else ""
        return (
            f"Let task {self._task['id']} ask its model ({model}) once more? It has spent "
            f"{spent:g} cents{waiting}, which reaches its budget of {limit:g} cents; what the "
            "answer costs is known only once it comes."
        )

    async def _upstream(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=UPSTREAM_TIMEOUT)
        return self._session

    async def _forward(
        self,
        request: web.Request,
        upstream: str,
        data: bytes,
        key: ModelKey,
        model: str,
    ) -> web.StreamResponse:
        headers = {
            "content-type": "application/json",
            "accept-encoding": "identity",
            "anthropic-version": DEFAULT_VERSION,
            **{name: request.headers[name] for name in PASSED_REQUEST if name in request.headers},
            **key.headers(),
        }
        session = await self._upstream()
        try:
            # Never followed: a redirect would carry the key (x-api-key) to wherever it points.
            reply = await session.post(
                f"{upstream}{MESSAGES}", data=data, headers=headers, allow_redirects=False
            )
        except (aiohttp.ClientError, TimeoutError) as error:
            log.warning("the model at %s could not be reached: %s", upstream, error)
            return api_error(503, f"the model at {upstream} could not be reached: {error}")
        async with reply:
            if reply.status == 401:
                await self._key_refused()
                return api_error(401, KEY_REFUSED, retry=False)
            if 300 <= reply.status < 400:
                return api_error(
                    502,
                    f"the model at {upstream} answered with a redirect (HTTP {reply.status}), "
                    "which the box does not follow: it would carry the key elsewhere; "
                    "set Settings modelBaseUrl to where the API really is",
                    retry=False,
                )
            return await self._pass_back(request, reply, model)

    async def _key_refused(self) -> None:
        log.warning("the upstream refused the model key (401): the task ends")
        try:
            await self._manager.call("ModelKeyRefused")
        except BoxError as error:
            log.warning("could not tell the manager the model key was refused: %s", error.message)

    async def _pass_back(
        self, request: web.Request, reply: aiohttp.ClientResponse, model: str
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=reply.status, headers=_reply_headers(reply))
        usage: StreamUsage | JsonUsage | None = None
        if reply.status == 200:
            usage = StreamUsage() if reply.content_type == "text/event-stream" else JsonUsage()
        logged: dict[str, int] = {}
        try:
            await response.prepare(request)
            async for chunk in reply.content.iter_any():
                if usage is not None:
                    usage.feed(chunk)
                    if not logged and isinstance(usage, StreamUsage) and usage.at_start:
                        logged = usage.at_start
                        self._log_cost_soon(logged, model)
                await response.write(chunk)
            await response.write_eof()
        except (aiohttp.ClientError, ConnectionError, TimeoutError) as error:
            # The worker hung up, or the upstream did: what the reply said so far is logged.
            log.info("a model reply was cut off: %s", error)
        finally:
            if usage is not None:
                if isinstance(usage, JsonUsage):
                    usage.finish()
                self._log_cost_soon(usage.since(logged), model)
        return response

    def _log_cost_soon(self, counts: dict[str, int], model: str) -> None:
        """Logs the cost of `counts` in a task of its own, so a handler cancelled mid-way (its
        worker gone) still logs what the model did."""
        tokens = tokens_of(counts)
        if tokens is None:
            return
        record = {
            "cents": price_cents(model, tokens),
            "what": "model",
            "model": model,
            "tokens": tokens.json(),
        }
        job = asyncio.create_task(self._log_cost(record))
        self._logging.add(job)
        job.add_done_callback(self._logging.discard)

    async def _log_cost(self, record: dict[str, Any]) -> None:
        try:
            await self._manager.call("LogCost", json.dumps(record))
        except BoxError as error:
            log.warning("could not log a model reply's cost: %s", error.message)

    async def settled(self) -> None:
        """Waits until the cost of every reply so far is logged (for tests and the bench)."""
        while self._logging:
            await asyncio.gather(*self._logging, return_exceptions=True)


def _reply_headers(reply: aiohttp.ClientResponse) -> dict[str, str]:
    return {
        name: value
        for name, value in reply.headers.items()
        if name.lower() in PASSED_REPLY or name.lower().startswith(PASSED_REPLY_PREFIX)
    }


_STATUS_OF = {
    Problem.INVALID: 400,
    Problem.UNAUTHORIZED: 401,
    Problem.FORBIDDEN: 403,
    Problem.NOT_FOUND: 404,
    Problem.TOO_LARGE: 413,
    # The manager away (boxd restarting): Droid tries again.
    Problem.UNAVAILABLE: RETRY_LATER,
    # The box's disk is full: nothing was logged; Droid tries again, by when there may be room.
    Problem.FULL: RETRY_LATER,
}


@web.middleware
async def _api_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except BoxError as failure:
        return api_error(_STATUS_OF.get(failure.problem, 500), failure.message)
    except web.HTTPRequestEntityTooLarge:
        return api_error(
            413, f"the request body is over {MAX_REQUEST_WORDS}, more than the model gateway takes"
        )
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
        return api_error(
            404,
            f"the model gateway serves POST {MESSAGES} (Anthropic's Messages API) only, "
            f"not {request.method} {request.path}",
        )
