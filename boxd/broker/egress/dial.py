"""Opening a connection for a task: check the target against its hosts, resolve the name here
(the task has no DNS), refuse addresses no task reaches and private addresses the hosts do not
list, then connect to the very address that was checked.

Connecting by address, never by name again, is what keeps DNS rebinding out: a resolver that
answers a public address for the check and 127.0.0.1 for the connection never gets asked twice.
"""

import asyncio
import errno
import os
import socket
from collections.abc import Awaitable, Callable

from boxd.broker.egress.connect import connect
from boxd.broker.egress.own_addresses import RecentOwnAddresses
from boxd.broker.egress.pipe import tcp_socket
from boxd.net.address_screen import (
    AddressCheck,
    never_reached,
    own_address_refusal,
    private_network,
)
from boxd.net.egress_target import IPAddress, Target, make_target
from boxd.net.host_rules import HostRules

# (name, port) -> the addresses to try, in order.
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]
OwnAddresses = Callable[[], Awaitable[set[IPAddress]]]
# Told of every refusal before the task is answered: (target "host:port", reason in plain words).
Refusal = Callable[[str, str], Awaitable[None]]

RESOLVE_SECONDS = 10.0
CONNECT_SECONDS = 10.0


class Refused(Exception):
    """The task may not go there; the message is the reason, in plain words."""


class Unreachable(Exception):
    """The task may go there, but the target did not answer; `code` is the errno, if any."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


async def system_resolver(name: str, port: int) -> list[IPAddress]:
    # getaddrinfo runs in the loop's thread pool: it blocks, but not the event loop.
    infos = await asyncio.get_running_loop().getaddrinfo(
        name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    found: list[IPAddress] = []
    for _, _, _, _, sockaddr in infos:
        target = make_target(str(sockaddr[0]), port)
        if target.address is not None and target.address not in found:
            found.append(target.address)
    return found


class RecentAnswers:
    """A resolver's answers, kept MAX_AGE seconds and shared by the connections that ask
    meanwhile. A lookup through the system's resolver is a hop to a thread and back (longer
    than the rest of a CONNECT's checks: docs/performance.md, "Egress"),
    and clients open their connections to a
    host in bursts (a package manager fetching many files). Every connection still screens the
    addresses it gets and connects to one of them, so a kept answer lets nothing through that a
    fresh one would refuse. Failures are not kept; at most MAX_NAMES names are, since the task
    chooses them (a wildcard rule allows endless names)."""

    MAX_AGE = 1.0
    MAX_NAMES = 256

    def __init__(self, resolve: Resolver) -> None:
        self._resolve = resolve
        self._answers: dict[str, tuple[float, asyncio.Future[list[IPAddress]]]] = {}

    async def __call__(self, name: str, port: int) -> list[IPAddress]:
        loop = asyncio.get_running_loop()
        kept = self._answers.get(name)
        if kept is None or loop.time() - kept[0] > self.MAX_AGE:
            # Addresses do not depend on the port; the first asker's is as good as any.
            lookup = asyncio.ensure_future(self._resolve(name, port))
            lookup.add_done_callback(lambda done: self._forget_failure(name, done))
            self._answers.pop(name, None)
            self._answers[name] = kept = (loop.time(), lookup)
            while len(self._answers) > self.MAX_NAMES:
                del self._answers[next(iter(self._answers))]
        # Shielded: one asker that gives up must not cancel the lookup for the others.
        return list(await asyncio.shield(kept[1]))

    def _forget_failure(self, name: str, lookup: asyncio.Future[list[IPAddress]]) -> None:
        # Retrieving the exception also keeps asyncio quiet when every asker gave up first.
        if lookup.cancelled() or lookup.exception() is not None:
            kept = self._answers.get(name)
            if kept is not None and kept[1] is lookup:
                del self._answers[name]


class Dialer:
    def __init__(
        self,
        rules: HostRules,
        resolver: Resolver | None = None,
        own_addresses: OwnAddresses | None = None,
        address_check: AddressCheck = never_reached,
    ) -> None:
        self.rules = rules
        self.resolver = resolver or RecentAnswers(system_resolver)
        self.own_addresses = own_addresses or RecentOwnAddresses()
        self.address_check = address_check

    async def addresses(self, target: Target) -> list[IPAddress]:
        """The addresses a target may be reached at, or Refused, or Unreachable."""
        reason = self.rules.refusal(target)
        if reason is not None:
            raise Refused(reason)
        if target.address is not None:
            addresses = [target.address]
        else:
            assert target.name is not None  # a valid target has a name or an address
            addresses = await self._resolve(target.name, target.port)
        try:
            own = await self.own_addresses()
        except OSError as error:
            # Without the box's own addresses no answer is safe; say so rather than guess.
            raise Refused(f"the broker cannot read this box's own addresses: {error}") from None
        # One bad address refuses the name: a name that points at the box is a trick, not a
        # host with a spare address.
        for address in addresses:
            why = (
                self.address_check(address)
                or own_address_refusal(address, own)
                or self._unlisted_private(address, target.port)
            )
            if why is not None:
                if target.name is not None:
                    raise Refused(f"{target.name} resolves to {address}, {why}")
                raise Refused(f"{address} is {why}")
        return addresses

    def _unlisted_private(self, address: IPAddress, port: int) -> str | None:
        """A private address is the owner's choice when the task's hosts list it, at that port:
        then a name that resolves to it reaches nothing the task could not reach by address."""
        why = private_network(address)
        if why is None or self.rules.refusal(Target(None, address, port)) is None:
            return None
        return why

    async def _resolve(self, name: str, port: int) -> list[IPAddress]:
        try:
            async with asyncio.timeout(RESOLVE_SECONDS):
                addresses = await self.resolver(name, port)
        except TimeoutError:
            raise Unreachable(f"looking up {name} took over {RESOLVE_SECONDS:.0f} s") from None
        except (OSError, UnicodeError) as error:
            raise Unreachable(f"{name} cannot be looked up: {_words(error)}") from None
        if not addresses:
            raise Unreachable(f"{name} has no address")
        return addresses

    async def open(
        self, target: Target, on_open: Callable[[], None] | None = None
    ) -> socket.socket:
        """A connected socket to the target, or Refused, or Unreachable (its message says why,
        after "could not connect to <target>: "). `on_open` runs the moment the connection is
        made, from the event loop's readiness callback (boxd.broker.egress.connect), before this
        returns: a proxy's answer to the task goes out a turn of the loop sooner."""
        failure = Unreachable("it did not answer")
        opened = False

        def made() -> None:
            nonlocal opened
            opened = True
            if on_open is not None:
                on_open()

        for address in await self.addresses(target):
            family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
            sock = tcp_socket(socket.socket(family, socket.SOCK_STREAM))
            try:
                async with asyncio.timeout(CONNECT_SECONDS):
                    # By address: nothing is resolved here.
                    await connect(sock, (str(address), target.port), made)
                return sock
            except TimeoutError:
                if opened:
                    # Made in the very turn the time ran out: the task was already told so.
                    return sock
                failure = Unreachable(
                    f"it did not answer within {CONNECT_SECONDS:.0f} s", errno.ETIMEDOUT
                )
            except OSError as error:
                failure = Unreachable(_words(error), error.errno)
            except BaseException:
                sock.close()
                raise
            sock.close()
        raise failure


def _words(error: BaseException) -> str:
    # asyncio's connect errors read "Connect call failed ('127.0.0.1', 80)"; the errno's own
    # words say what happened.
    if isinstance(error, socket.gaierror):
        return str(error.strerror or error).lower()
    if isinstance(error, OSError) and error.errno:
        return os.strerror(error.errno).lower()
    return str(error) or type(error).__name__
