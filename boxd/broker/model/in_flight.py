"""The places of the model requests one task has in flight, and the exchanges with the upstream
that hold them. A place is taken before the request's body is read and held until its exchange
is over, which may outlast the worker's connection (boxd.broker.model.exchange): so the gateway
holds MAX_IN_FLIGHT bodies at most, however many connections say they have one coming."""

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from boxd.broker.model.messages_api import api_error

# Model requests one task has in flight at once (read, waiting for the owner, streaming, or read
# on after the worker hung up): Droid sends one at a time, a few with subagents. Each may hold a
# 32 MiB body while it runs (256 MiB for all eight), one at a time is checked (what checking
# costs: docs/performance.md, "A model request's memory"), and the broker has 512 MiB
# (box-broker@.service MemoryMax=).
MAX_IN_FLIGHT = 8

# The request's exchange with the upstream, once handed to one: it holds the request's place.
EXCHANGE = web.RequestKey(f"{__name__}.exchange", asyncio.Task)


class InFlight:
    def __init__(self) -> None:
        self.taken = 0
        # The exchanges with the upstream still open: the broker is busy while any is
        # (boxd/broker/idle.py).
        self.exchanges: set[asyncio.Task[web.StreamResponse]] = set()

    @web.middleware
    async def place(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """One of MAX_IN_FLIGHT places, held from before the body is read until the request's
        exchange with the upstream is over, which may outlast this handler."""
        if self.taken >= MAX_IN_FLIGHT:
            return api_error(
                429,
                f"this task has {MAX_IN_FLIGHT} model requests in flight, the most the model "
                "gateway takes at once: send this one again when one has finished",
            )
        self.taken += 1
        try:
            return await handler(request)
        finally:
            if request.get(EXCHANGE) is None:
                self.taken -= 1

    def hand_over(self, request: web.Request, exchange: "asyncio.Task[web.StreamResponse]") -> None:
        """The request's place is the exchange's now, until it is over."""
        self.exchanges.add(exchange)
        request[EXCHANGE] = exchange
        exchange.add_done_callback(self._over)

    def _over(self, exchange: "asyncio.Task[web.StreamResponse]") -> None:
        self.taken -= 1
        self.exchanges.discard(exchange)

    async def finish(self, seconds: float) -> None:
        """Lets the exchanges run for `seconds`, then cuts off those still open."""
        if self.exchanges:
            await asyncio.wait(set(self.exchanges), timeout=seconds)
        for exchange in self.exchanges:
            exchange.cancel()
        await asyncio.gather(*self.exchanges, return_exceptions=True)
