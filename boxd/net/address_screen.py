"""The addresses a task's egress refuses, in two kinds.

`never_reached`: addresses no task reaches, whatever its hosts say. The box itself (loopback
and, through `own_address_refusal`, its own addresses), link-local neighbours (most clouds'
metadata service is one, at 169.254.169.254), the other clouds' metadata services (they hand out
the machine's credentials), and addresses that are not one host (unspecified, multicast,
broadcast, reserved).

`private_network`: addresses inside somebody's network rather than on the Internet: RFC 1918,
carrier-grade NAT, IPv6 unique-local and site-local, and the protocol blocks local to a network.
A name a task's hosts allow may resolve to anything its DNS says, so a name that resolves to one
of these is refused; the owner who wants the task to reach a private address lists that address
itself, and the Dialer then lets it through (see boxd.broker.egress.dial).

Documentation (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32) and benchmarking
(198.18.0.0/15, 2001:2::/48) blocks are neither: no network numbers its own hosts from them by
standard and the Internet routes none of them, so a name that resolves there reaches nothing of
anyone's. The test machines' simulated outside world lives in the benchmarking blocks, so that
its names are reached as a public host's are.

IPv6 forms that carry an IPv4 address are judged by that address: IPv4-mapped (::ffff:a.b.c.d,
which the kernel connects as a.b.c.d), NAT64 (64:ff9b::/96, which a NAT64 gateway connects to
the embedded address), 6to4 (2002::/16) and Teredo (2001::/32, its server and client). A public
address in them passes: NAT64 is how IPv6-only networks reach IPv4 hosts.
"""

import functools
import ipaddress
from collections.abc import Callable

from boxd.net.egress_target import IPAddress

# Why an address is refused, or None when it may be reached. The reason reads after the
# address, "127.0.0.1 is <reason>" or "example.com resolves to 127.0.0.1, <reason>", so it
# names what the address is: "a loopback address: ...".
AddressCheck = Callable[[IPAddress], str | None]

_v4 = ipaddress.IPv4Network
_v6 = ipaddress.IPv6Network

_METADATA = "a cloud metadata service's address: it hands out this machine's credentials"
# Most clouds' is 169.254.169.254, link-local and so never reached; these two sit in blocks a
# listed address may open (unique-local, carrier-grade NAT), so they are named apart.
CLOUD_METADATA = {
    ipaddress.ip_address("fd00:ec2::254"): _METADATA,  # AWS over IPv6
    ipaddress.ip_address("100.100.100.200"): _METADATA,  # Alibaba Cloud
}

_NOT_ONE_HOST = "not the address of one host"
_THE_BOX = "tasks never reach the box itself"
# Said of each of a family's blocks, one for IPv4 and one for IPv6.
_LOOPBACK = f"a loopback address: {_THE_BOX}"
_LINK_LOCAL = "a link-local address"

NEVER: list[tuple[_v4 | _v6, str]] = [
    (_v4("127.0.0.0/8"), _LOOPBACK),
    (_v6("::1/128"), _LOOPBACK),
    (_v4("169.254.0.0/16"), _LINK_LOCAL),
    (_v6("fe80::/10"), _LINK_LOCAL),
    (_v4("0.0.0.0/8"), f'{_NOT_ONE_HOST} ("this network")'),
    (_v6("::/128"), f"{_NOT_ONE_HOST} (unspecified)"),
    (_v4("224.0.0.0/4"), f"a multicast address, {_NOT_ONE_HOST}"),
    (_v6("ff00::/8"), f"a multicast address, {_NOT_ONE_HOST}"),
    (_v4("255.255.255.255/32"), f"the broadcast address, {_NOT_ONE_HOST}"),
    (_v4("240.0.0.0/4"), f"a reserved address, {_NOT_ONE_HOST}"),
]

LISTED = "a task reaches one only when its hosts list the address itself"
_RFC_1918 = f"a private network's address (RFC 1918): {LISTED}"

PRIVATE: list[tuple[_v4 | _v6, str]] = [
    (_v4("10.0.0.0/8"), _RFC_1918),
    (_v4("172.16.0.0/12"), _RFC_1918),
    (_v4("192.168.0.0/16"), _RFC_1918),
    (_v4("100.64.0.0/10"), f"a carrier-grade NAT address (100.64.0.0/10): {LISTED}"),
    (_v4("192.0.0.0/24"), f"an address for protocols within a network (192.0.0.0/24): {LISTED}"),
    (_v6("fc00::/7"), f"a unique local IPv6 address (fc00::/7), a private network's: {LISTED}"),
    (_v6("fec0::/10"), f"a site-local IPv6 address (fec0::/10), a private network's: {LISTED}"),
    (_v6("64:ff9b:1::/48"), f"a local-use NAT64 address (64:ff9b:1::/48): {LISTED}"),
]

_NAT64 = _v6("64:ff9b::/96")


def _embedded(address: IPAddress) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 form carries, with the form's name, or None."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return "the IPv4-mapped form", address.ipv4_mapped
    if address in _NAT64:
        return "the NAT64 form", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return "a 6to4 address", address.sixtofour
    return None


def _teredo(address: IPAddress) -> tuple[ipaddress.IPv4Address, ...]:
    if isinstance(address, ipaddress.IPv6Address) and address.teredo is not None:
        return address.teredo
    return ()


def _judge(
    address: IPAddress, table: list[tuple[_v4 | _v6, str]], check: AddressCheck
) -> str | None:
    embedded = _embedded(address)
    if embedded is not None:
        form, inner = embedded
        why = check(inner)
        return None if why is None else f"{form} of {inner}, {why}"
    for inner in _teredo(address):
        why = check(inner)
        if why is not None:
            return f"a Teredo address carrying {inner}, {why}"
    for network, why in table:
        if address.version == network.version and address in network:
            return why
    return None


def _unscoped(address: IPAddress) -> IPAddress:
    # fd00:ec2::254%eth0 is fd00:ec2::254 on that link, but is not equal to it in Python.
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        return ipaddress.IPv6Address(int(address))
    return address


# The verdicts below depend on the address alone; a task dials the same few addresses again and
# again, and each verdict takes a dozen network look-ups.
_VERDICTS = 4096


@functools.lru_cache(maxsize=_VERDICTS)
def never_reached(address: IPAddress) -> str | None:
    """Why no task reaches this address, even one its hosts list; None if some task may."""
    address = _unscoped(address)
    if address in CLOUD_METADATA:
        return CLOUD_METADATA[address]
    why = _judge(address, NEVER, never_reached)
    if why is not None or _embedded(address) is not None:
        return why
    # What IANA keeps back beyond the blocks named here: IPv6's unassigned blocks and the
    # deprecated IPv4-compatible ::a.b.c.d. Local-use NAT64 is among them, but private.
    if address.is_reserved and private_network(address) is None:
        return f"a reserved address, {_NOT_ONE_HOST}"
    return None


@functools.lru_cache(maxsize=_VERDICTS)
def private_network(address: IPAddress) -> str | None:
    """Why a task reaches this address only when its hosts list it; None if it is public."""
    return _judge(_unscoped(address), PRIVATE, private_network)


def own_address_refusal(address: IPAddress, own: set[IPAddress]) -> str | None:
    address = _unscoped(address)
    embedded = _embedded(address)
    if address in own or (embedded is not None and embedded[1] in own):
        return f"this box's own address: {_THE_BOX}"
    return None
