"""A task's way out to the network: the HTTP proxy and the SOCKS5 proxy its broker serves on the
sockets systemd binds on 127.0.0.1 inside the task's network namespace.

Both check every target against the task's hosts, resolve names in the broker (the task has no
DNS) and never reach the box itself. A refusal is reported to on_refusal, then answered.
"""

import asyncio
import errno
import logging
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from boxd.broker.egress.dial import Dialer, Refusal, Resolver
from boxd.broker.egress.http_proxy import HttpProxy
from boxd.broker.egress.pipe import tcp_socket
from boxd.broker.egress.socks5 import Socks5Proxy
from boxd.doors.connection_limits import EGRESS_CONNECTIONS, LISTEN_BACKLOG, TURNED_AWAY
from boxd.net.address_screen import AddressCheck, never_reached
from boxd.net.egress_target import IPAddress
from boxd.net.host_rules import HostRules

__all__ = ["Egress", "IPAddress", "Refusal", "Resolver", "task_hosts"]

log = logging.getLogger(__name__)

# Connections open at once through both proxies (boxd/doors/connection_limits.py). Each holds two
# sockets and two kernel pipes (boxd/broker/egress/pipe.py), so a task that opened them without end
# would wear the broker down.
MAX_CONNECTIONS = EGRESS_CONNECTIONS
# What accept(2) fails with when the process or the system is out of descriptors or memory:
# asyncio's servers stop accepting for a second then, and so does this one, rather than spin.
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
ACCEPT_RETRY_SECONDS = 1.0
# Connections accepted at most per wake-up of the listening socket.
ACCEPT_BATCH = 64

Handler = Callable[[socket.socket], Coroutine[Any, Any, None]]
Busy = Callable[[socket.socket, int], Coroutine[Any, Any, None]]


class Egress:
    """The task's egress proxies. `hosts` are rules in boxd.net.hosts' forms; a bad one raises
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
        self._listeners: list[_Listener] = []
        self._connections: set[asyncio.Task[None]] = set()
        # Of them, those being told the proxy is full.
        self._turned_away: set[asyncio.Task[None]] = set()
        self.max_connections = MAX_CONNECTIONS

    @property
    def open_connections(self) -> int:
        """Connections being served now, through both proxies."""
        return len(self._connections)

    async def serve_http(self, sock: socket.socket) -> None:
        """Serves the HTTP proxy on an already-listening socket (the one systemd passes)."""
        self._serve(self._http.handle, self._http.busy, sock)

    async def serve_socks(self, sock: socket.socket) -> None:
        """Serves SOCKS5 on an already-listening socket (the one systemd passes)."""
        self._serve(self._socks.handle, self._socks.busy, sock)

    async def close(self) -> None:
        """Stops listening (closing the listening sockets) and ends every open connection."""
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()
        for connection in self._connections:
            connection.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        self._socks.close()

    def _serve(self, handle: Handler, busy: Busy, sock: socket.socket) -> None:
        def serve(connection: socket.socket) -> None:
            full = len(self._connections) - len(self._turned_away) >= self.max_connections
            if full and len(self._turned_away) >= TURNED_AWAY:
                # Telling each one costs a descriptor for a while: a task connecting without
                # end would take the broker's last one, and every door would stop accepting.
                connection.close()
                return
            # Turned-away connections are tracked too, so close() ends them as well.
            task: asyncio.Task[None] = asyncio.get_running_loop().create_task(
                busy(connection, self.max_connections) if full else handle(connection)
            )
            self._connections.add(task)
            if full:
                self._turned_away.add(task)
            task.add_done_callback(self._finished)

        self._listeners.append(_Listener(sock, serve))

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._connections.discard(task)
        self._turned_away.discard(task)
        # The handlers end every connection's expected failures themselves; anything else is a
        # bug, said here rather than when the task is collected.
        if not task.cancelled() and task.exception() is not None:
            log.error("egress connection failed", exc_info=task.exception())


class _Listener:
    """Accepts connections on a listening socket straight from the event loop's readiness
    callback, and hands each to `serve`: no asyncio transport or stream is built for them, as a
    tunnel's bytes go from socket to socket (boxd.broker.egress.pipe), and no task waits on
    accept."""

    def __init__(self, sock: socket.socket, serve: Callable[[socket.socket], None]) -> None:
        self.sock = sock
        self.serve = serve
        self.loop = asyncio.get_running_loop()
        self.retry: asyncio.TimerHandle | None = None
        sock.setblocking(False)
        # Listening again sets the backlog: systemd's own default (asyncio's would be 100).
        sock.listen(LISTEN_BACKLOG)
        self.loop.add_reader(sock.fileno(), self._ready)

    def _ready(self) -> None:
        # A burst is taken in one go, as asyncio's own servers do.
        for _ in range(ACCEPT_BATCH):
            try:
                connection, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as error:
                if error.errno not in _OUT_OF_RESOURCES:
                    raise
                # Out of descriptors or memory: pause rather than spin, as asyncio's servers do.
                log.warning("egress proxy cannot accept connections for now: %s", error)
                self.loop.remove_reader(self.sock.fileno())
                self.retry = self.loop.call_later(ACCEPT_RETRY_SECONDS, self._resume)
                return
            self.serve(tcp_socket(connection))

    def _resume(self) -> None:
        self.retry = None
        self.loop.add_reader(self.sock.fileno(), self._ready)

    def close(self) -> None:
        if self.retry is not None:
            self.retry.cancel()
        else:
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()


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
