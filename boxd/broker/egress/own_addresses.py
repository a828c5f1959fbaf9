"""This box's own IP addresses, read from the kernel's tables in /proc (no `ip`, no new
dependency): the IPv4 addresses the local routing table marks `/32 host LOCAL`, and every
address in /proc/net/if_inet6.

The broker runs in the main network namespace, so these are the addresses of the box's own
services, which a task must never reach by a name that resolves to one of them.
"""

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable
from pathlib import Path

from boxd.net.egress_target import IPAddress

FIB_TRIE = Path("/proc/net/fib_trie")
IF_INET6 = Path("/proc/net/if_inet6")


def parse_fib_trie(text: str) -> set[IPAddress]:
    """The trie lists each address on a `|-- a.b.c.d` line, then its routes, one a line."""
    found: set[IPAddress] = set()
    address = ""
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "|--":
            address = words[1]
        elif words == ["/32", "host", "LOCAL"] and address:
            found.add(ipaddress.IPv4Address(address))
    return found


def parse_if_inet6(text: str) -> set[IPAddress]:
    found: set[IPAddress] = set()
    for line in text.splitlines():
        words = line.split()
        if words and len(words[0]) == 32:
            found.add(ipaddress.IPv6Address(int(words[0], 16)))
    return found


def _read() -> set[IPAddress]:
    found = parse_fib_trie(FIB_TRIE.read_text())
    # A box without IPv6 has no if_inet6 at all.
    if IF_INET6.exists():
        found |= parse_if_inet6(IF_INET6.read_text())
    return found


async def own_addresses() -> set[IPAddress]:
    """Read afresh. Raises OSError when /proc cannot be read; the caller refuses rather than
    guess."""
    return await asyncio.to_thread(_read)


class RecentOwnAddresses:
    """own_addresses, read at most once per MAX_AGE seconds and shared by the connections that
    ask meanwhile. A read in a thread costs about half a millisecond, most of a new
    connection's set-up; addresses come and go (DHCP, VPNs) far less often than that."""

    MAX_AGE = 1.0

    def __init__(self, read: Callable[[], Awaitable[set[IPAddress]]] = own_addresses) -> None:
        self._reader = read
        self._read: asyncio.Future[set[IPAddress]] | None = None
        self._read_at = 0.0

    async def __call__(self) -> set[IPAddress]:
        loop = asyncio.get_running_loop()
        if self._read is None or loop.time() - self._read_at > self.MAX_AGE:
            self._read_at = loop.time()
            self._read = asyncio.ensure_future(self._reader())
        read = self._read
        try:
            # Shielded: one caller that gives up must not cancel the read for the others.
            return await asyncio.shield(read)
        except OSError:
            # A failed read is not kept: the next connection tries again.
            if self._read is read:
                self._read = None
            raise
