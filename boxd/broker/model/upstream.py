"""Where the model gateway may send a request, and the model key with it.

Settings `modelBaseUrl` is https (or http to this machine's loopback: boxd.wire.models.settings),
and the address its host resolves to is screened as a task's egress screens one
(boxd.net.address_screen), each time a connection is made: never a link-local neighbour, a
cloud's metadata service, a multicast or reserved address, nor this box's own addresses; a private
network's address only where the URL names that address itself; loopback only where the URL names
loopback (`localhost`, 127.0.0.1, [::1]: a proxy the owner runs on this machine). So a name whose
DNS answer changes (rebinding) cannot carry the key to a host the owner never named.

aiohttp connects to what this resolver answers, and only to that; a URL whose host is an address
is not resolved at all, so `check_url_host` screens it before each request.
"""

import ipaddress
import socket

from aiohttp.abc import AbstractResolver, ResolveResult

from boxd.broker.egress.dial import RecentAnswers, system_resolver
from boxd.broker.egress.own_addresses import RecentOwnAddresses
from boxd.net.address_screen import (
    LISTED,
    never_reached,
    own_address_refusal,
    private_network,
)
from boxd.net.egress_target import IPAddress

LOCALHOST = "localhost"


class UpstreamRefused(OSError):
    """The upstream's address is one the key may not go to; the message says why."""


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]").removesuffix("."))
    except ValueError:
        return None


def names_loopback(host: str) -> bool:
    """Whether the URL's host is this machine's loopback, by name or address."""
    literal = _literal(host)
    return host.lower() == LOCALHOST or (literal is not None and literal.is_loopback)


def refusal(host: str, address: IPAddress, own: set[IPAddress]) -> str | None:
    """Why the key may not go to `address`, which the URL's `host` gave; None if it may."""
    if names_loopback(host):
        return None if address.is_loopback else "not this machine's loopback, which the URL names"
    why = never_reached(address) or own_address_refusal(address, own)
    if why is not None:
        return why.replace("tasks never reach", "the model key never goes to")
    private = private_network(address)
    if private is not None and address != _literal(host):
        return private.replace(
            LISTED, "the model key goes to one only when Settings modelBaseUrl names it"
        )
    return None


class ScreenedResolver(AbstractResolver):
    """aiohttp's resolver for the model upstream: the system's answers, screened."""

    def __init__(self) -> None:
        # Looked up through this module's name, so a test can answer for the system.
        self._answers = RecentAnswers(lambda name, port: system_resolver(name, port))
        self._own = RecentOwnAddresses()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        try:
            addresses = await self._answers(host, port)
        except (OSError, UnicodeError) as error:
            raise OSError(f"{host} cannot be looked up: {error}") from None
        if not addresses:
            raise OSError(f"{host} has no address")
        own = await self._own()
        # One bad address refuses the name, as egress does: a name pointing at a neighbour
        # beside a public address is a trick, not a spare.
        for address in addresses:
            why = refusal(host, address, own)
            if why is not None:
                raise UpstreamRefused(f"{host} resolves to {address}, {why}")
        return [
            ResolveResult(
                hostname=host,
                host=str(address),
                port=port,
                family=socket.AF_INET6 if address.version == 6 else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in addresses
        ]

    async def close(self) -> None:
        pass

    async def check_url_host(self, host: str) -> None:
        """Screens a URL host that is an address, which aiohttp connects to unresolved."""
        literal = _literal(host)
        if literal is None:
            return
        why = refusal(host, literal, await self._own())
        if why is not None:
            raise UpstreamRefused(f"{literal} is {why}")
