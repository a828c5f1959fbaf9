"""Where a task wants to connect: a host (a name or an IP address) and a port.

Targets come from the task, so nothing here trusts them: a name is lower-cased and checked
label by label before anything matches it against the rules or hands it to the resolver.
"""

import ipaddress
import re
from dataclasses import dataclass

from boxd.reading.decimal_text import decimal

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Underscores are not legal in host names but real ones have them; they cannot reach a rule,
# which boxd.net.hosts keeps to letters, digits and hyphens, except through a wildcard.
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")
MAX_NAME = 253


class BadTarget(Exception):
    """The request names no host and port one could connect to; the message says why."""


@dataclass(frozen=True)
class Target:
    """`name` is a checked host name, or None when the task gave an IP address."""

    name: str | None
    address: IPAddress | None
    port: int
    # What the task sent, for refusals of names that are not host names.
    raw: str = ""

    def __str__(self) -> str:
        if self.address is not None:
            if self.address.version == 6:
                return f"[{self.address}]:{self.port}"
            return f"{self.address}:{self.port}"
        return f"{self.name or self.raw}:{self.port}"

    @property
    def host(self) -> str:
        return str(self.address) if self.address is not None else self.name or self.raw

    @property
    def valid(self) -> bool:
        return self.name is not None or self.address is not None


def _port(text: str, where: str) -> int:
    port = decimal(text, most_digits=5)
    if port is None or not 1 <= port <= 65535:
        raise BadTarget(f"{where} has a port that is not a number from 1 to 65535")
    return port


def check_name(raw: str) -> str | None:
    """The name in canonical form (lower case, no trailing dot), or None if it is not one."""
    name = raw.lower().removesuffix(".")
    if not name or len(name) > MAX_NAME:
        return None
    labels = name.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return None
    # An all-digit last label is an IPv4 address in one of inet_aton's odd spellings
    # (2130706433, 127.1): the resolver would turn it into an address no rule named.
    if labels[-1].isdigit():
        return None
    return name


def make_target(host: str, port: int) -> Target:
    # An IPv4 address ends in a digit and an IPv6 one has colons: anything else is a name,
    # known without ip_address's two failed parses (most of a name's cost here).
    if ":" not in host and not host[-1:].isdigit():
        return Target(check_name(host), None, port, raw=host[:MAX_NAME])
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return Target(check_name(host), None, port, raw=host[:MAX_NAME])
    return Target(None, address, port)


def parse_authority(text: str, default_port: int | None = None) -> Target:
    """`host:port`, `[v6]:port` or, with a default port, `host` alone (the URL's form)."""
    where = repr(text[:300])
    if text.startswith("["):
        inside, bracket, rest = text[1:].partition("]")
        if not bracket:
            raise BadTarget(f"{where} opens an IPv6 address with [ but never closes it")
        try:
            address = ipaddress.IPv6Address(inside)
        except ValueError:
            raise BadTarget(f"{where} has no IPv6 address between [ and ]") from None
        if not rest and default_port is not None:
            return Target(None, address, default_port)
        if not rest.startswith(":"):
            raise BadTarget(f"{where} needs a port, like [2001:db8::1]:443")
        return Target(None, address, _port(rest[1:], where))
    host, colon, port = text.rpartition(":")
    if not colon:
        if default_port is None:
            raise BadTarget(f"{where} needs a port, like example.com:443")
        host, port = text, str(default_port)
    if not host:
        raise BadTarget(f"{where} has no host")
    if ":" in host:
        raise BadTarget(f"{where} is an IPv6 address without brackets; write [{host}]:{port}")
    return make_target(host, _port(port, where))
