"""The addresses no task reaches, whatever its hosts say: the box itself (loopback and its own
addresses), link-local neighbours (the cloud metadata service lives at 169.254.169.254), and
addresses that are not one host (unspecified, multicast, broadcast, reserved)."""

import ipaddress
from collections.abc import Callable

from boxd.broker.egress_target import IPAddress

# Why an address is never reached, or None when it may be. The reason reads after the address,
# "127.0.0.1 is <reason>" or "example.com resolves to 127.0.0.1, <reason>", so it names what
# the address is: "a loopback address: ...".
AddressCheck = Callable[[IPAddress], str | None]

_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")


def _unwrapped(address: IPAddress) -> IPAddress:
    # ::ffff:127.0.0.1 is 127.0.0.1 to the kernel, but not is_loopback to Python 3.11.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def never_reached(address: IPAddress) -> str | None:
    address = _unwrapped(address)
    if address.is_loopback:
        return "a loopback address: tasks never reach the box itself"
    if address.is_link_local:
        return "a link-local address"
    if address.is_unspecified or address.is_multicast or address.is_reserved:
        return "not the address of one host"
    if isinstance(address, ipaddress.IPv4Address) and address in _THIS_NETWORK:
        return "not the address of one host"
    return None


def own_address_refusal(address: IPAddress, own: set[IPAddress]) -> str | None:
    if _unwrapped(address) in own:
        return "this box's own address: tasks never reach the box itself"
    return None
