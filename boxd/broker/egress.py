"""A task's way out to the network: the HTTP proxy and the SOCKS5 proxy its broker serves on the
sockets systemd binds on 127.0.0.1 inside the task's network namespace.

Both check every target against the task's hosts, resolve names in the broker (the task has no
DNS) and never reach the box itself. A refusal is reported to on_refusal, then answered.
"""

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from boxd.broker.address_screen import AddressCheck, never_reached
from boxd.broker.egress_dial import Dialer, Refusal, Resolver
from boxd.broker.egress_target import IPAddress
from boxd.broker.host_rules import HostRules
from boxd.broker.http_proxy import HttpProxy
from boxd.broker.socks5 import Socks5Proxy
from boxd.connection_limits import EGRESS_CONNECTIONS, LISTEN_BACKLOG

__all__ = ["Egress", "IPAddress", "Refusal", "Resolver", "task_hosts"]

log = logging.getLogger(__name__)

# Reads from the task's side of a connection: the proxies copy in chunks this big.
STREAM_LIMIT = 256 * 1024
# Connections open at once through both proxies (boxd/connection_limits.py). Each holds two
# sockets and up to about a megabyte of buffers, so a task that opened them without end would
# wear the broker down.
MAX_CONNECTIONS = EGRESS_CONNECTIONS

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Busy = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class Egress:
    """The task's egress proxies. `hosts` are rules in boxd.hosts' forms; a bad one raises
    BoxError in its plain words.

    `address_check` says which addresses no task reaches; tests relax it to reach their own
    servers on 127.0.0.1. It is a constructor argument only: nothing a task sends, and no
    setting or environment variable, can change it."""

    def __init__(
        self,
        hosts: list[str],
        on_refusal: Refusal,
        *,
        resolver: Resolver | None = None,
        own_addresses: Callable[[], Awaitable[set[IPAddress]]] | None = None,
        address_check: AddressCheck = never_reached,
    ) -> None:
        dialer = Dialer(HostRules(hosts), resolver, own_addresses, address_check)
        self._http = HttpProxy(dialer, _still_refusing(on_refusal))
        self._socks = Socks5Proxy(dialer, _still_refusing(on_refusal))
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.Task[None]] = set()
        self.max_connections = MAX_CONNECTIONS

    async def serve_http(self, sock: socket.socket) -> asyncio.Server:
        """Serves the HTTP proxy on an already-listening socket (the one systemd passes)."""
        return await self._serve(self._http.handle, self._http.busy, sock)

    async def serve_socks(self, sock: socket.socket) -> asyncio.Server:
        """Serves SOCKS5 on an already-listening socket (the one systemd passes)."""
        return await self._serve(self._socks.handle, self._socks.busy, sock)

    async def close(self) -> None:
        """Stops listening and ends every open connection: Server.close() alone leaves them
        running in Python 3.11."""
        for server in self._servers:
            server.close()
        for connection in self._connections:
            connection.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()

    async def _serve(self, handle: Handler, busy: Busy, sock: socket.socket) -> asyncio.Server:
        async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None  # asyncio runs each connection in a task of its own
            full = len(self._connections) >= self.max_connections
            # Turned-away connections are tracked too, so close() ends them as well.
            self._connections.add(task)
            try:
                if full:
                    await busy(reader, writer, self.max_connections)
                else:
                    await handle(reader, writer)
            finally:
                self._connections.discard(task)

        sock.setblocking(False)
        server = await asyncio.start_server(
            tracked, sock=sock, limit=STREAM_LIMIT, backlog=LISTEN_BACKLOG
        )
        self._servers.append(server)
        return server


def _still_refusing(on_refusal: Refusal) -> Refusal:
    """A refusal whose logging failed is still a refusal, and the task still gets its answer."""

    async def report(target: str, reason: str) -> None:
        try:
            await on_refusal(target, reason)
        except Exception:
            log.exception("egress refused %s (%s) but could not log it", target, reason)

    return report


def task_hosts(task: dict[str, Any]) -> list[str]:
    """The hosts a task's egress allows, from its public JSON: a Droid task at low autonomy
    gets none (its model traffic goes through the model gateway, not here); medium and high
    keep the task's hosts, as does a task without Droid settings (the fake worker)."""
    hosts = [str(host) for host in task.get("hosts") or []]
    droid = task.get("droid")
    if isinstance(droid, dict) and droid.get("autonomy", "low") == "low":
        return []
    return hosts
