"""The exchange of one model request with the upstream: the request sent with the vault's key,
the reply passed back to the worker chunk by chunk and metered as it passes. It runs as a job
of its own, so it outlives the worker's connection: a reply the worker no longer reads is read
on to its end for its usage (within DRAIN_BYTES and DRAIN_SECONDS), and its cost is reported
whatever happens, cancellation included (boxd.broker.model.cost_reports)."""

import asyncio
import logging
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from boxd.broker.manager_link import Manager
from boxd.broker.model.body import LARGE_BODY
from boxd.broker.model.cost_reports import CostReports, Reply
from boxd.broker.model.key import ModelKey
from boxd.broker.model.messages_api import MESSAGES, api_error
from boxd.broker.model.request import ModelRequest
from boxd.broker.model.upstream import ScreenedResolver, UpstreamRefused
from boxd.broker.model.usage import JsonUsage, StreamUsage
from boxd.dbus import interface as api
from boxd.errors import BoxError
from boxd.wire.model_key import KEY_REFUSED

log = logging.getLogger(__name__)

DEFAULT_VERSION = "2023-06-01"
# Request headers the upstream gets from the worker's request; nothing else of it passes (no
# key, no authorization, no cookie), and the gateway adds the key. anthropic-beta is checked.
PASSED_REQUEST = ("anthropic-version", "anthropic-beta")
# Reply headers the worker gets from the upstream's reply.
PASSED_REPLY = ("content-type", "request-id", "retry-after", "x-should-retry")
PASSED_REPLY_PREFIX = "anthropic-ratelimit-"
UPSTREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=30, sock_connect=30, sock_read=600)
# A reply the worker no longer reads is read on to its end for its usage, up to these: past
# them it is cut off and charged what was reserved for it.
DRAIN_BYTES = 64 * 1024 * 1024
DRAIN_SECONDS = 600.0
# Bodies sent upstream in slices of this size, so a slow upstream makes the transport hold a
# slice, not a copy of the body.
SEND_SLICE = 256 * 1024


class Upstream:
    """The gateway's client of the upstream: one session, its addresses screened."""

    def __init__(self, manager: Manager, reports: CostReports) -> None:
        self._manager = manager
        self._reports = reports
        self._session: aiohttp.ClientSession | None = None
        self._resolver: ScreenedResolver | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def exchange(
        self,
        request: web.Request,
        request_id: str,
        upstream: str,
        checked: ModelRequest,
        key: ModelKey,
    ) -> web.StreamResponse:
        """Sends the request and passes the reply back; reads on when the worker is gone. Its
        cost is reported whatever happens, cancellation included."""
        seen = Reply(request_id)
        try:
            return await self._send(request, upstream, checked, key, seen)
        finally:
            self._reports.end_seen(seen)

    async def _client(self) -> tuple[aiohttp.ClientSession, ScreenedResolver]:
        if self._session is None or self._resolver is None:
            self._resolver = ScreenedResolver()
            connector = aiohttp.TCPConnector(resolver=self._resolver, use_dns_cache=False)
            self._session = aiohttp.ClientSession(connector=connector, timeout=UPSTREAM_TIMEOUT)
        return self._session, self._resolver

    async def _send(
        self,
        request: web.Request,
        upstream: str,
        checked: ModelRequest,
        key: ModelKey,
        seen: Reply,
    ) -> web.StreamResponse:
        headers = {
            "content-type": "application/json",
            "content-length": str(checked.length),
            "accept-encoding": "identity",
            "anthropic-version": DEFAULT_VERSION,
            **{name: request.headers[name] for name in PASSED_REQUEST if name in request.headers},
            **key.headers(),
        }
        session, resolver = await self._client()
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
        self, request: web.Request, reply: aiohttp.ClientResponse, seen: Reply
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
                    self._reports.start_seen(seen)
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


async def _slices(parts: tuple[memoryview, ...], seen: Reply) -> AsyncIterator[memoryview]:
    """The body in slices; `seen.sent` once the last is handed to the connection."""
    for part in parts:
        for start in range(0, len(part), SEND_SLICE):
            yield part[start : start + SEND_SLICE]
    seen.sent = True


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


def _reply_headers(reply: aiohttp.ClientResponse) -> dict[str, str]:
    return {
        name: value
        for name, value in reply.headers.items()
        if name.lower() in PASSED_REPLY or name.lower().startswith(PASSED_REPLY_PREFIX)
    }
