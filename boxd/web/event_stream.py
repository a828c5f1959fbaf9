"""`GET /api/events`: the owner's live events as Server-Sent Events (boxd.web.live_events).

Who may listen is the manager's decision, as for every route: the stream asks it with the
caller's token (an owner-only method that changes nothing) when it opens, and again while it is
open, so a revoked session or token stops hearing the box soon: before passing on an event when
the last check is a second old, and at every heartbeat when nothing happens. When boxd does
not answer that check, the stream closes (the screen's page connects again on its own).
"""

import asyncio
import json
import time
from collections.abc import Callable

from aiohttp import web

from boxd.dbus import interface as api
from boxd.dbus.client import GatewayClient
from boxd.errors import BoxError, Problem
from boxd.web.live_events import LiveEvent, LiveEvents
from boxd.web.screen_session import SESSION_ENDED, is_screen_session

EVENTS_PATH = "/api/events"
# Owner-only and read-only: admitted exactly where the stream is.
CHECK_METHOD = api.GET_AGENTS
HEARTBEAT_SECONDS = 15.0
CHECK_EVERY_SECONDS = 1.0
# How often a quiet stream looks whether its client went away: the gateway is not told, and a
# gone client's place among the MAX_STREAMS must come free soon.
GONE_SECONDS = 1.0
HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-store",
    # A proxy in front must pass each event on as it comes, not gather them.
    "X-Accel-Buffering": "no",
}


def sse(event: LiveEvent) -> bytes:
    data = "".join(f"data: {line}\n" for line in event.data.split("\n"))
    return f"event: {event.name}\n{data}\n".encode()


async def check(client: GatewayClient, token: str) -> None:
    await client.call_as(token, CHECK_METHOD)


def _ended(request: web.Request, failure: BoxError) -> LiveEvent:
    words = failure.message
    if failure.problem == Problem.UNAUTHORIZED and is_screen_session(request):
        words = SESSION_ENDED
    return LiveEvent("end", json.dumps({"error": words}))


class Timing:
    def __init__(
        self,
        heartbeat: float = HEARTBEAT_SECONDS,
        check_every: float = CHECK_EVERY_SECONDS,
        gone: float = GONE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.heartbeat = heartbeat
        self.check_every = check_every
        self.gone = gone
        self.clock = clock


async def serve_events(
    request: web.Request,
    client: GatewayClient,
    hub: LiveEvents,
    token: str,
    timing: Timing,
) -> web.StreamResponse:
    # Refusals come before anything is sent, as plain JSON errors with their status.
    await check(client, token)
    transport = request.transport

    def drop() -> None:
        # abort, not close: close would wait for the unread buffer to drain first.
        if transport is not None:
            transport.abort()

    subscription = await hub.subscribe(drop)
    response = web.StreamResponse(headers=HEADERS)
    try:
        await response.prepare(request)
        await response.write(b": live\n\n")
        checked = beat = timing.clock()
        while not subscription.dropped and request.transport is not None:
            now = timing.clock()
            wait = min(timing.gone, max(0.0, beat + timing.heartbeat - now))
            try:
                event: LiveEvent | None = await asyncio.wait_for(subscription.queue.get(), wait)
            except TimeoutError:
                event = None
            now = timing.clock()
            if event is None and now < beat + timing.heartbeat:
                continue
            if event is None or now - checked >= timing.check_every:
                try:
                    await check(client, token)
                except BoxError as failure:
                    # While boxd does not answer no one can say the caller may still hear it
                    # (its signals may still come): nothing passes. Closed without an end
                    # event, the screen connects again by itself and is asked again then.
                    if failure.problem != Problem.UNAVAILABLE:
                        await response.write(sse(_ended(request, failure)))
                    break
                checked = now
            if event is None:
                await response.write(b": heartbeat\n\n")
                beat = now
            else:
                await response.write(sse(event))
        return response
    except ConnectionError:
        # The client went away, or was dropped for not reading.
        return response
    finally:
        hub.unsubscribe(subscription)
