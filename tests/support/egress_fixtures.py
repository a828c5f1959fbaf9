"""Real servers on 127.0.0.1 for the egress tests, and an Egress that may reach them.

Loopback is refused by design, so the egress under test gets a resolver that maps the test's
names to 127.0.0.1 and an address check that lets loopback through (and nothing else that
production refuses). Tests of the refusals themselves use the production check.
"""

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from boxd.broker.egress.proxies import Egress
from boxd.net.address_screen import never_reached
from boxd.net.egress_target import IPAddress

LOOPBACK = ipaddress.IPv4Address("127.0.0.1")


def loopback_allowed(address: IPAddress) -> str | None:
    return None if address == LOOPBACK else never_reached(address)


def resolver_to(
    names: dict[str, list[IPAddress]], asked: list[str] | None = None
) -> Callable[[str, int], Awaitable[list[IPAddress]]]:
    async def resolve(name: str, port: int) -> list[IPAddress]:
        if asked is not None:
            asked.append(name)
        if name not in names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return names[name]

    return resolve


async def no_own_addresses() -> set[IPAddress]:
    return set()


def listening() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


@dataclass
class Running:
    egress: Egress
    port: int = 0
    refusals: list[tuple[str, str]] = field(default_factory=list)


# Names the tests use; every one resolves to the test servers on 127.0.0.1.
TEST_NAMES = ["example.com", "a.example.com", "b.a.example.com", "other.example.org"]


@asynccontextmanager
async def egress(
    hosts: list[str],
    kind: str = "http",
    *,
    production_check: bool = False,
    names: dict[str, list[IPAddress]] | None = None,
    own: set[IPAddress] | None = None,
) -> AsyncIterator[Running]:
    refusals: list[tuple[str, str]] = []

    async def on_refusal(target: str, reason: str) -> None:
        refusals.append((target, reason))

    async def own_addresses() -> set[IPAddress]:
        return own or set()

    proxy = Egress(
        hosts,
        on_refusal,
        resolver=resolver_to(names or {name: [LOOPBACK] for name in TEST_NAMES}),
        own_addresses=own_addresses,
        address_check=never_reached if production_check else loopback_allowed,
    )
    running = Running(proxy, refusals=refusals)
    sock = listening()
    running.port = sock.getsockname()[1]
    await (proxy.serve_http(sock) if kind == "http" else proxy.serve_socks(sock))
    try:
        yield running
    finally:
        await proxy.close()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[int]:
    """A server on 127.0.0.1 running `handler` per connection; yields its port."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    started = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield started.sockets[0].getsockname()[1]
    finally:
        started.close()
        await started.wait_closed()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echoes until the client's end of stream, then says bye and closes."""
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.write(b"bye")
    await writer.drain()


async def free_port() -> int:
    """A port on 127.0.0.1 with nothing listening on it."""
    sock = listening()
    port: int = sock.getsockname()[1]
    sock.close()
    return port
