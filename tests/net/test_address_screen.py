"""Every block the egress screen refuses, in each form an address can take."""

import ipaddress

import pytest

from boxd.net.address_screen import never_reached, own_address_refusal, private_network
from boxd.net.egress_target import IPAddress


def address(text: str) -> IPAddress:
    return ipaddress.ip_address(text)


NEVER = [
    ("127.0.0.1", "a loopback address"),
    ("127.9.9.9", "a loopback address"),
    ("::1", "a loopback address"),
    ("169.254.169.254", "a link-local address"),
    ("fd00:ec2::254", "a cloud metadata service's address"),
    ("fd00:ec2::254%eth0", "a cloud metadata service's address"),
    ("100.100.100.200", "a cloud metadata service's address"),
    ("169.254.0.1", "a link-local address"),
    ("169.254.255.254", "a link-local address"),
    ("fe80::1", "a link-local address"),
    ("fe80::1%2", "a link-local address"),
    ("febf::1", "a link-local address"),
    ("0.0.0.0", "not the address of one host"),
    ("0.1.2.3", "not the address of one host"),
    ("::", "not the address of one host"),
    ("224.0.0.1", "a multicast address"),
    ("239.255.255.250", "a multicast address"),
    ("ff02::1", "a multicast address"),
    ("ff0e::1", "a multicast address"),
    ("255.255.255.255", "the broadcast address"),
    ("240.0.0.1", "a reserved address"),
    ("::10.0.0.1", "a reserved address"),  # IPv4-compatible, long deprecated
    ("4000::1", "a reserved address"),
    ("fe00::1", "a reserved address"),
    ("fbff::1", "a reserved address"),
]

PRIVATE = [
    ("10.0.0.1", "RFC 1918"),
    ("10.255.255.255", "RFC 1918"),
    ("172.16.0.1", "RFC 1918"),
    ("172.31.255.254", "RFC 1918"),
    ("192.168.1.1", "RFC 1918"),
    ("100.64.0.1", "carrier-grade NAT"),
    ("100.127.255.254", "carrier-grade NAT"),
    ("192.0.0.8", "protocols within a network"),
    ("fd00::1", "unique local"),
    ("fc00::1", "unique local"),
    ("fec0::1", "site-local"),
    ("64:ff9b:1::a00:1", "local-use NAT64"),
]

# Embeddings of IPv4 addresses in IPv6, each judged by the address it carries.
EMBEDDED_NEVER = [
    ("::ffff:127.0.0.1", "the IPv4-mapped form of 127.0.0.1, a loopback address"),
    ("::ffff:169.254.169.254", "the IPv4-mapped form of 169.254.169.254, a link-local"),
    ("::ffff:224.0.0.1", "the IPv4-mapped form of 224.0.0.1, a multicast address"),
    ("::ffff:0.0.0.0", "the IPv4-mapped form of 0.0.0.0, not the address of one host"),
    ("64:ff9b::7f00:1", "the NAT64 form of 127.0.0.1, a loopback address"),
    ("64:ff9b::a9fe:a9fe", "the NAT64 form of 169.254.169.254, a link-local address"),
    ("::ffff:100.100.100.200", "the IPv4-mapped form of 100.100.100.200, a cloud metadata"),
    ("2002:7f00:1::1", "a 6to4 address of 127.0.0.1, a loopback address"),
    # Teredo: server 65.54.227.120, client 127.0.0.1 (stored inverted: 80ff:fffe).
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "a Teredo address carrying 127.0.0.1"),
]

EMBEDDED_PRIVATE = [
    ("::ffff:10.0.0.1", "the IPv4-mapped form of 10.0.0.1, a private network's address"),
    ("::ffff:192.168.1.1", "the IPv4-mapped form of 192.168.1.1, a private network's"),
    ("::ffff:100.64.0.1", "the IPv4-mapped form of 100.64.0.1, a carrier-grade NAT"),
    ("64:ff9b::a00:1", "the NAT64 form of 10.0.0.1, a private network's address"),
    ("64:ff9b::ac10:1", "the NAT64 form of 172.16.0.1, a private network's address"),
    ("2002:c0a8:101::1", "a 6to4 address of 192.168.1.1, a private network's address"),
    # Teredo: client 10.0.0.1, stored inverted as f5ff:fffe.
    ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "a Teredo address carrying 10.0.0.1"),
]

PUBLIC = [
    "93.184.216.34",
    "1.1.1.1",
    "2606:2800:220:1::",
    "2a00:1450:4001:82b::200e",
    # Public addresses in every IPv6 form: NAT64 is how IPv6-only networks reach IPv4.
    "::ffff:93.184.216.34",
    "64:ff9b::5db8:d822",
    "2002:5db8:d822::1",
    # Beside the refused blocks, not in them.
    "172.15.255.255",
    "172.32.0.1",
    "100.63.255.255",
    "100.128.0.1",
    "11.0.0.1",
    "192.167.255.255",
    "192.169.0.1",
    "223.255.255.255",
    "2c0f:f248::1",
    # Documentation and benchmarking blocks: routed nowhere, numbered by no network's hosts.
    "192.0.2.1",
    "198.51.100.1",
    "203.0.113.1",
    "2001:db8::1",
    "198.18.0.2",
    "198.19.255.254",
    "2001:2::2",
]


@pytest.mark.parametrize(("text", "why"), NEVER + EMBEDDED_NEVER)
def test_addresses_no_task_reaches_even_when_listed(text: str, why: str) -> None:
    found = never_reached(address(text))
    assert found is not None and found.startswith(why), found


@pytest.mark.parametrize(("text", "why"), PRIVATE + EMBEDDED_PRIVATE)
def test_private_addresses(text: str, why: str) -> None:
    found = private_network(address(text))
    assert found is not None and why in found, found
    assert found.endswith("a task reaches one only when its hosts list the address itself")
    # Private, not never: the owner may list one.
    assert never_reached(address(text)) is None


@pytest.mark.parametrize("text", PUBLIC)
def test_public_addresses_pass_both(text: str) -> None:
    assert never_reached(address(text)) is None
    assert private_network(address(text)) is None


def test_the_box_s_own_address_in_any_form() -> None:
    own = {address("198.18.0.1"), address("2001:2::1")}
    for text in ["198.18.0.1", "::ffff:198.18.0.1", "64:ff9b::c612:1", "2001:2::1"]:
        assert own_address_refusal(address(text), own) is not None, text
    assert own_address_refusal(address("198.18.0.2"), own) is None
