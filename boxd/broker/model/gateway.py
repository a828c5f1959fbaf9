"""The task's model gateway: Anthropic's Messages API, served by the broker on the socket systemd
binds at 127.0.0.1:3130 in the task's network namespace (units/box-model@.socket), so the model
key never enters the sandbox.

For each `POST /v1/messages` it:
- reads the body with bounded memory and checks it against the allowlists of what a client model
  request needs (boxd.broker.model.request, allowlist): refused in words that name what;
- drops whatever key or authorization the worker sent and adds the vault's model key
  (boxd.wire.model_key), which only the broker can read;
- runs the request on the task's model, whatever model it names;
- reserves the request's worst case with the manager before it goes (`BeginModelRequest`: an
  estimate of its input plus `max_tokens` at the output price, counted with every other request
  and call in flight), and asks the owner first when that would take the task past its budget.
  One yes lets one request through: once a request under it is answered 200 it is spent
  (Droid's retries of a request that got no 200 go again under it); no answer in time is a 529
  that Droid retries;
- forwards it to the upstream (settings' modelBaseUrl, its address screened:
  boxd.broker.model.upstream), whatever the task's hosts say, and passes the reply back as it
  arrives, chunk by chunk;
- meters every reply the upstream delivers, whatever the worker does with its connection: the
  exchange with the upstream is a job of its own that reads on to the end (within DRAIN_BYTES
  and DRAIN_SECONDS) once the worker has hung up, and the broker is busy, never idle, while one
  is open. What `message_start` said (the input and cache tokens) is logged as soon as it has
  passed, the rest once the reply ends (`LogModelCost`, priced by the manager); a reply that
  ends without its final usage is charged what was reserved for it, and so is one a broker
  killed mid-way left open (the manager settles those: boxd.manager.model_requests);
- tells the manager when the upstream refuses the key (401): the task ends failed, saying so.

Nothing here logs a request's headers or the key.
"""

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from boxd.broker.credentials import read_secrets
from boxd.broker.manager_link import Manager, Waiter
from boxd.broker.model.allowlist import Refused
from boxd.broker.model.request import (
    ModelRequest,
    NotAnObject,
    TooDense,
    read_request,
)
from boxd.broker.model.upstream import ScreenedResolver, UpstreamRefused
from boxd.broker.model.usage import JsonUsage, StreamUsage
from boxd.dbus import interface as api
from boxd.doors.connection_guard import Guard
from boxd.doors.connection_limits import MODEL_GATEWAY_CONNECTIONS, Bounds
from boxd.errors import BoxError, Problem
from boxd.wire.approval import ApprovalState
from boxd.wire.model_key import ANTHROPIC_KEY, KEY_NAMES, KEY_REFUSED
from boxd.wire.pricing import price_of

log = logging.getLogger(__name__)

MESSAGES = "/v1/messages"
# A long Droid conversation is resent whole each turn: hundreds of thousands of tokens of text,
# tool results and images, base64. Anthropic's own limit for a Messages request is 32 MB.
MAX_REQUEST = 32 * 1024 * 1024
MAX_REQUEST_WORDS = "32 MiB"
# Model requests one task has in flight at once (read, waiting for the owner, streaming, or read
# on after the worker hung up): Droid sends one at a time, a few with subagents. Each may hold a
# 32 MiB body while it runs (256 MiB for all eight), one at a time is checked (some 100 MiB more
# at most), and the broker has 512 MiB (box-broker@.service MemoryMax=).
MAX_IN_FLIGHT = 8
DEFAULT_VERSION = "2023-06-01"
# Request headers the upstream gets from the worker's request; nothing else of it passes (no
# key, no authorization, no cookie), and the gateway adds the key. anthropic-beta is checked.
PASSED_REQUEST = ("anthropic-version", "anthropic-beta")
# Reply headers the worker gets from the upstream's reply.
PASSED_REPLY = ("content-type", "request-id", "retry-after", "x-should-retry")
PASSED_REPLY_PREFIX = "anthropic-ratelimit-"
# The status Droid 0.225.2 retries, with its own backoff (about 5 s, 14 s, then every 33 s,
# nine times over some four minutes, before it gives up), as it does 500, 503 and 429. A 401
# or 403 it does not retry: the `droid exec` fails at once.
RETRY_LATER = 529
UPSTREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=30, sock_connect=30, sock_read=600)
# A reply the worker no longer reads is read on to its end for its usage, up to these: past
# them it is cut off and charged what was reserved for it.
DRAIN_BYTES = 64 * 1024 * 1024
DRAIN_SECONDS = 600.0
# A broker told to stop lets the replies being read finish for this long (as calls do:
# boxd/broker/calls.py), then cuts them off and has them charged what was reserved.
FINISH_SECONDS = 30.0
# Bodies sent upstream in slices of this size, so a slow upstream makes the transport hold a
# slice, not a copy of the body.
SEND_SLICE = 256 * 1024
# Bodies larger than this are checked in a thread, one at a time (checking takes memory in
# proportion to the body), and sent upstream in slices.
LARGE_BODY = 1024 * 1024
# How long a reply's cost report is tried again on a full disk (doubling waits from 0.5 s).
REPORT_PATIENCE_SECONDS = 60

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
    secrets_found = read_secrets(KEY_NAMES)
    for name in KEY_NAMES:
        if secrets_found.get(name):
            return ModelKey(name, secrets_found[name].strip())
    return None


class TooLarge(Exception):
    pass


BODY = web.RequestKey(f"{__name__}.body", bytearray)
# The request's exchange with the upstream, once handed to one: it holds the request's place.
EXCHANGE = web.RequestKey(f"{__name__}.exchange", asyncio.Task)


async def read_body(request: web.Request) -> bytearray:
    """The request's body, up to MAX_REQUEST, in one buffer: of the size the request says when
    it says one, so no copy of it is made (aiohttp's own read joins its chunks into a second
    one). Kept in the request: the connection guard reads it whole before the handler runs."""
    kept = request.get(BODY)
    if isinstance(kept, bytearray):
        return kept
    length = request.content_length
    if length is not None and length > MAX_REQUEST:
        raise TooLarge
    body = bytearray(length or 0)
    view = memoryview(body)
    got = 0
    async for chunk in request.content.iter_any():
        if got + len(chunk) > (MAX_REQUEST if length is None else length):
            raise TooLarge
        if length is None:
            view.release()
            body += chunk
            view = memoryview(body)
        else:
            view[got : got + len(chunk)] = chunk
        got += len(chunk)
    view.release()
    if length is not None and got != length:
        raise ConnectionResetError("the request's body ended before its length")
    request[BODY] = body
    return body


async def keep_body(request: web.Request) -> None:
    """read_body for the connection guard: a body over MAX_REQUEST is left for the handler to
    refuse in the API's words."""
    with contextlib.suppress(TooLarge):
        await read_body(request)


async def _slices(parts: tuple[memoryview, ...], seen: "_Reply") -> AsyncIterator[memoryview]:
    """The body in slices; `seen.sent` once the last is handed to the connection."""
    for part in parts:
        for start in range(0, len(part), SEND_SLICE):
            yield part[start : start + SEND_SLICE]
    seen.sent = True


@dataclass
class _Reply:
    """What one exchange with the upstream has seen, for its cost."""

    request: str
    status: int = 0
    # Whether the whole request went upstream: one that got no answer then may have been
    # worked on, and is charged the most it could cost.
    sent: bool = False
    usage: StreamUsage | JsonUsage | None = None
    started: dict[str, int] | None = None
    start_logged: "asyncio.Task[None] | None" = None


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
        self._resolver: ScreenedResolver | None = None
        self._guards: list[Guard] = []
        self._requests = 0
        # One body is checked at a time: checking takes memory in proportion to it.
        self._checking = asyncio.Lock()
        # The exchanges with the upstream still open, and the cost reports on their way: the
        # broker is busy while any is (boxd/broker/idle.py).
        self._exchanges: set[asyncio.Task[web.StreamResponse]] = set()
        self._reports: set[asyncio.Task[None]] = set()

    def app(self) -> web.Application:
        # The slot is taken before the body is read (the connection guard reads it whole, after
        # these), so what the gateway holds is MAX_IN_FLIGHT bodies at most, however many
        # connections say they have one coming.
        app = web.Application(
            middlewares=[_api_errors, self._in_flight_slot], client_max_size=MAX_REQUEST
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
        return bool(self._exchanges or self._reports)

    async def close(self) -> None:
        """Lets the replies being read finish for FINISH_SECONDS, then cuts them off (each is
        then charged what was reserved for it), and waits for every cost to be logged."""
        for guard in self._guards:
            await guard.close()
        if self._exchanges:
            await asyncio.wait(set(self._exchanges), timeout=FINISH_SECONDS)
        for exchange in self._exchanges:
            exchange.cancel()
        await asyncio.gather(*self._exchanges, return_exceptions=True)
        await self.settled()
        if self._session is not None:
            await self._session.close()

    async def settled(self) -> None:
        """Waits until every exchange is over and its cost logged (for tests and the bench)."""
        while self._exchanges or self._reports:
            await asyncio.gather(*self._exchanges, *self._reports, return_exceptions=True)

    @web.middleware
    async def _in_flight_slot(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """One of MAX_IN_FLIGHT places, held from before the body is read until the request's
        exchange with the upstream is over, which may outlast this handler."""
        if self._requests >= MAX_IN_FLIGHT:
            return api_error(
                429,
                f"this task has {MAX_IN_FLIGHT} model requests in flight, the most the model "
                "gateway takes at once: send this one again when one has finished",
            )
        self._requests += 1
        try:
            return await handler(request)
        finally:
            if request.get(EXCHANGE) is None:
                self._requests -= 1

    def _exchange_over(self, exchange: "asyncio.Task[web.StreamResponse]") -> None:
        self._requests -= 1
        self._exchanges.discard(exchange)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        outcome = await self._message(request)
        if isinstance(outcome, asyncio.Task):
            request[EXCHANGE] = outcome
            outcome.add_done_callback(self._exchange_over)
            # Shielded: a handler cancelled as its worker goes leaves the exchange running.
            return await asyncio.shield(outcome)
        return outcome

    async def _message(
        self, request: web.Request
    ) -> "web.StreamResponse | asyncio.Task[web.StreamResponse]":
        try:
            body = await read_body(request)
        except TooLarge:
            return _too_large()
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
        exchange = asyncio.create_task(
            self._exchange(request, request_id, str(begun["upstream"]), checked, key)
        )
        self._exchanges.add(exchange)
        return exchange

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

    async def _upstream(self) -> tuple[aiohttp.ClientSession, ScreenedResolver]:
        if self._session is None or self._resolver is None:
            self._resolver = ScreenedResolver()
            connector = aiohttp.TCPConnector(resolver=self._resolver, use_dns_cache=False)
            self._session = aiohttp.ClientSession(connector=connector, timeout=UPSTREAM_TIMEOUT)
        return self._session, self._resolver

    async def _exchange(
        self,
        request: web.Request,
        request_id: str,
        upstream: str,
        checked: ModelRequest,
        key: ModelKey,
    ) -> web.StreamResponse:
        """Sends the request and passes the reply back; reads on when the worker is gone. Its
        cost is reported whatever happens, cancellation included."""
        seen = _Reply(request_id)
        try:
            return await self._send(request, upstream, checked, key, seen)
        finally:
            self._report_soon(seen)

    async def _send(
        self,
        request: web.Request,
        upstream: str,
        checked: ModelRequest,
        key: ModelKey,
        seen: _Reply,
    ) -> web.StreamResponse:
        headers = {
            "content-type": "application/json",
            "content-length": str(checked.length),
            "accept-encoding": "identity",
            "anthropic-version": DEFAULT_VERSION,
            **{name: request.headers[name] for name in PASSED_REQUEST if name in request.headers},
            **key.headers(),
        }
        session, resolver = await self._upstream()
        # A large body goes in slices, so a slow upstream makes the transport hold one slice,
        # not a copy of the body; a small one whole, which costs a request less.
        small = checked.length <= LARGE_BODY
        data = b"".join(checked.parts) if small else _slices(checked.parts, seen)
        try:
            await resolver.check_url_host(urlsplit(upstream).hostname or "")
            # Never followed: a redirect would carry the key (x-api-key) to wherever it points.
            reply = await session.post(
                f"{upstream}{MESSAGES}", data=data, headers=headers, allow_redirects=False
            )
        except asyncio.CancelledError:
            # Cut off as the broker stops, FINISH_SECONDS after: it went, as far as anyone knows.
            seen.sent = seen.sent or small
            raise
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            # A connection never made sent nothing; past that, the request may have gone whole
            # (a small body is written at once), and the upstream may be working on it.
            if small and not isinstance(error, aiohttp.ClientConnectorError | UpstreamRefused):
                seen.sent = True
            words = _reach_words(error)
            log.warning("the model at %s could not be reached: %s", upstream, words)
            return api_error(503, f"the model at {upstream} could not be reached: {words}")
        async with reply:
            seen.status = reply.status
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
            return await self._pass_back(request, reply, seen)

    async def _key_refused(self) -> None:
        log.warning("the upstream refused the model key (401): the task ends")
        try:
            await self._manager.call(api.MODEL_KEY_REFUSED)
        except BoxError as error:
            log.warning("could not tell the manager the model key was refused: %s", error.message)

    async def _pass_back(
        self, request: web.Request, reply: aiohttp.ClientResponse, seen: _Reply
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=reply.status, headers=_reply_headers(reply))
        if reply.status == 200:
            streamed = reply.content_type == "text/event-stream"
            seen.usage = StreamUsage() if streamed else JsonUsage()
        worker = await _prepared(response, request)
        loop = asyncio.get_running_loop()
        drained = 0
        gone_at = 0.0 if worker else loop.time()
        try:
            async for chunk in reply.content.iter_any():
                if seen.usage is not None:
                    seen.usage.feed(chunk)
                    self._start_seen(seen)
                if worker:
                    worker = await _written(response, chunk)
                    gone_at = 0.0 if worker else loop.time()
                    continue
                drained += len(chunk)
                if drained > DRAIN_BYTES or loop.time() - gone_at > DRAIN_SECONDS:
                    log.info("a model reply its worker left was cut off past the gateway's caps")
                    break
            if worker:
                await _written(response, None)
        except (aiohttp.ClientError, TimeoutError) as error:
            # The upstream hung up: what the reply said so far counts, and the rest of what
            # was reserved is charged if it never said its final usage.
            log.info("a model reply was cut off by the upstream: %s", error)
        finally:
            if isinstance(seen.usage, JsonUsage):
                seen.usage.finish()
        return response

    def _start_seen(self, seen: _Reply) -> None:
        """Logs what message_start said (the input and cache tokens, most of what a request
        costs) as soon as it has passed: a broker killed later leaves only the output to the
        reservation."""
        usage = seen.usage
        if seen.started is None and isinstance(usage, StreamUsage) and usage.at_start:
            seen.started = usage.at_start
            part = {"request": seen.request, "part": "start", "tokens": usage.at_start}
            seen.start_logged = self._log_soon(self._log_part(part))

    def _log_soon(self, job: Awaitable[None]) -> "asyncio.Task[None]":
        """A report in a job of its own, so a handler cancelled mid-way still makes it."""
        task = asyncio.ensure_future(job)
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)
        return task

    def _report_soon(self, seen: _Reply) -> None:
        self._log_soon(self._report_end(seen))

    async def _report_end(self, seen: _Reply) -> None:
        if seen.start_logged is not None:
            await asyncio.wait({seen.start_logged})
        usage = seen.usage
        part = {
            "request": seen.request,
            "part": "end",
            "status": seen.status,
            "sent": seen.sent,
            # All the reply said: the manager charges what it did not charge yet.
            "tokens": usage.counts() if usage is not None else {},
            # The reply said its final usage: else it is charged the most it could cost.
            "complete": usage is not None and usage.final,
        }
        await self._log_part(part)

    async def _log_part(self, part: dict[str, Any]) -> None:
        """Tells the manager, trying again for a while on a full disk (the manager link waits
        for a manager that restarts): until it is told, the request holds its worst case."""
        delay = 0.5
        while True:
            try:
                await self._manager.call(api.LOG_MODEL_COST, json.dumps(part))
                return
            except BoxError as error:
                if error.problem != Problem.FULL or delay > REPORT_PATIENCE_SECONDS:
                    log.warning("could not log a model reply's cost: %s", error.message)
                    return
            await asyncio.sleep(delay)
            delay *= 2


async def _prepared(response: web.StreamResponse, request: web.Request) -> bool:
    """Whether the reply's head reached the worker (False: it hung up)."""
    try:
        await response.prepare(request)
        return True
    except ConnectionError:
        return False


async def _written(response: web.StreamResponse, chunk: bytes | None) -> bool:
    """Whether `chunk` (None: the reply's end) reached the worker (False: it hung up)."""
    try:
        if chunk is None:
            await response.write_eof()
        else:
            await response.write(chunk)
        return True
    except ConnectionError:
        return False


def _reach_words(error: BaseException) -> str:
    cause = getattr(error, "os_error", None)
    if isinstance(cause, OSError) and cause.args:
        return str(cause.args[-1] if not cause.strerror else cause.strerror)
    return str(error) or type(error).__name__


def _too_large() -> web.Response:
    return api_error(
        413, f"the request body is over {MAX_REQUEST_WORDS}, more than the model gateway takes"
    )


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
        return _too_large()
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
        return api_error(
            404,
            f"the model gateway serves POST {MESSAGES} (Anthropic's Messages API) only, "
            f"not {request.method} {request.path}",
        )
