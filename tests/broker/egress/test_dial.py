import asyncio
import ipaddress
import socket

import pytest

from boxd.broker.egress.dial import (
    Dialer,
    RecentAnswers,
    Refused,
    Unreachable,
    system_resolver,
)
from boxd.broker.egress.own_addresses import (
    RecentOwnAddresses,
    own_addresses,
    parse_fib_trie,
    parse_if_inet6,
)
from boxd.net.egress_target import IPAddress, make_target, parse_authority
from boxd.net.host_rules import HostRules
from tests.support.egress_fixtures import LOOPBACK, echo, loopback_allowed, resolver_to, server

PUBLIC = ipaddress.IPv4Address("93.184.216.34")
OWN = ipaddress.IPv4Address("192.0.2.2")


def address(text: str) -> IPAddress:
    return ipaddress.ip_address(text)


FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     +-- 192.0.2.0/24 2 0 2
        +-- 192.0.2.0/30 2 0 2
           |-- 192.0.2.0
              /24 link UNICAST
           |-- 192.0.2.2
              /32 host LOCAL
        |-- 192.0.2.255
           /32 link BROADCAST
"""
IF_INET6 = """00000000000000000000000000000001 01 80 10 80       lo
fd000000000000000000000000000002 04 40 00 82     eth0
"""


def test_own_addresses_from_the_kernel_tables() -> None:
    assert parse_fib_trie(FIB_TRIE) == {LOOPBACK, OWN}
    assert parse_if_inet6(IF_INET6) == {address("::1"), address("fd00::2")}


def dialer(
    hosts: list[str], names: dict[str, list[IPAddress]], asked: list[str] | None = None
) -> Dialer:
    async def own() -> set[IPAddress]:
        return {OWN}

    return Dialer(HostRules(hosts), resolver_to(names, asked), own)


async def refused(dial: Dialer, target: str) -> str:
    with pytest.raises(Refused) as caught:
        await dial.addresses(parse_authority(target))
    return str(caught.value)


async def test_a_name_resolving_to_the_box_is_refused_whatever_the_hosts_say() -> None:
    dial = dialer(["example.com"], {"example.com": [LOOPBACK]})
    assert await refused(dial, "example.com:443") == (
        "example.com resolves to 127.0.0.1, a loopback address: tasks never reach the box itself"
    )
    dial = dialer(["example.com"], {"example.com": [OWN]})
    assert "resolves to 192.0.2.2, this box's own address" in await refused(dial, "example.com:443")
    dial = dialer(["example.com"], {"example.com": [address("169.254.169.254")]})
    assert ", a link-local address" in await refused(dial, "example.com:443")
    dial = dialer(["example.com"], {"example.com": [address("100.100.100.200")]})
    assert ", a cloud metadata service's address" in await refused(dial, "example.com:443")


async def test_one_bad_address_refuses_the_name() -> None:
    # A rebinding resolver hides the box behind a public address; neither is tried.
    dial = dialer(["example.com"], {"example.com": [PUBLIC, LOOPBACK]})
    assert "loopback" in await refused(dial, "example.com:443")


async def test_a_listed_address_of_the_box_is_still_refused() -> None:
    dial = dialer(["192.0.2.2"], {})
    assert await refused(dial, "192.0.2.2:22") == (
        "192.0.2.2 is this box's own address: tasks never reach the box itself"
    )


@pytest.mark.parametrize(
    "private", ["10.1.2.3", "192.168.1.1", "172.16.0.1", "100.64.0.1", "fd00::1", "::ffff:10.0.0.1"]
)
async def test_a_name_resolving_to_a_private_address_is_refused(private: str) -> None:
    dial = dialer(["example.com"], {"example.com": [PUBLIC, address(private)]})
    found = await refused(dial, "example.com:443")
    assert found.startswith(f"example.com resolves to {address(private)}, ")
    assert found.endswith("a task reaches one only when its hosts list the address itself")


async def test_a_private_address_the_hosts_list_is_the_owner_s_choice() -> None:
    db = address("10.0.0.5")
    dial = dialer(["10.0.0.5:5432", "[fd00::5]", "db.internal"], {"db.internal": [db]})
    assert await dial.addresses(parse_authority("10.0.0.5:5432")) == [db]
    assert await dial.addresses(parse_authority("[fd00::5]:22")) == [address("fd00::5")]
    # By a name too: it reaches nothing the task could not reach by the address, on its port.
    assert await dial.addresses(parse_authority("db.internal:5432")) == [db]
    assert "a private network's address" in await refused(dial, "db.internal:22")


async def test_the_rules_are_checked_before_the_name_is_looked_up() -> None:
    asked: list[str] = []
    dial = dialer(["example.com"], {"evil.example.org": [PUBLIC]}, asked)
    assert await refused(dial, "evil.example.org:443") == "it is not in this task's hosts"
    assert asked == []


async def test_unreadable_own_addresses_refuse_rather_than_guess() -> None:
    async def broken() -> set[IPAddress]:
        raise PermissionError(13, "Permission denied")

    dial = Dialer(HostRules(["example.com"]), resolver_to({"example.com": [PUBLIC]}), broken)
    assert "cannot read this box's own addresses" in await refused(dial, "example.com:443")


async def test_a_name_that_does_not_resolve_is_unreachable_not_refused() -> None:
    dial = dialer(["example.com"], {})
    with pytest.raises(Unreachable) as caught:
        await dial.addresses(parse_authority("example.com:443"))
    assert "example.com cannot be looked up: name or service not known" in str(caught.value)


async def test_it_connects_to_the_checked_address_and_asks_the_resolver_once() -> None:
    asked: list[str] = []

    async def own() -> set[IPAddress]:
        return set()

    resolve = resolver_to({"example.com": [LOOPBACK]}, asked)
    dial = Dialer(HostRules(["example.com"]), resolve, own, loopback_allowed)
    async with server(echo) as port:
        upstream = await dial.open(parse_authority(f"example.com:{port}"))
        reader, writer = await asyncio.open_connection(sock=upstream)
        writer.write(b"hi")
        writer.write_eof()
        assert await reader.read() == b"hibye"
        writer.close()
    assert asked == ["example.com"]


async def test_own_addresses_are_read_once_a_second_and_failures_are_not_kept() -> None:
    reads: list[int] = []

    async def read() -> set[IPAddress]:
        reads.append(1)
        if len(reads) == 1:
            raise PermissionError(13, "Permission denied")
        return {OWN}

    recent = RecentOwnAddresses(read)
    with pytest.raises(PermissionError):
        await recent()
    shared = await asyncio.gather(recent(), recent(), recent())
    assert all(found == {OWN} for found in shared)
    assert len(reads) == 2
    recent.MAX_AGE = 0.0
    await asyncio.sleep(0.01)
    await recent()
    assert len(reads) == 3


async def test_the_system_resolver_and_the_kernel_tables_of_this_machine() -> None:
    assert LOOPBACK in await system_resolver("localhost", 80)
    assert LOOPBACK in await own_addresses()


async def test_production_defaults_refuse_what_resolves_to_the_box() -> None:
    # The real resolver, the real own addresses and the real check; the rule is only there to
    # let the name past the host check (no rule may name localhost itself).
    dial = Dialer(HostRules(["example.com"]))
    with pytest.raises(Refused) as caught:
        await dial.addresses(make_target("localhost", 80))
    assert str(caught.value) == "it is not in this task's hosts"

    async def localhost(name: str, port: int) -> list[IPAddress]:
        return await system_resolver("localhost", port)

    dial.resolver = localhost
    with pytest.raises(Refused) as caught:
        await dial.addresses(parse_authority("example.com:80"))
    assert "a loopback address: tasks never reach the box itself" in str(caught.value)


async def test_answers_are_kept_a_second_and_shared_and_failures_are_not_kept() -> None:
    asked: list[str] = []
    release = asyncio.Event()

    async def resolve(name: str, port: int) -> list[IPAddress]:
        asked.append(name)
        await release.wait()
        if name == "nowhere.example.com" and asked.count(name) == 1:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [PUBLIC]

    recent = RecentAnswers(resolve)
    together = [asyncio.ensure_future(recent("example.com", port)) for port in (80, 443)]
    # One asker gives up: the lookup goes on for the others.
    quitter = asyncio.ensure_future(recent("example.com", 80))
    await asyncio.sleep(0)
    quitter.cancel()
    release.set()
    assert await asyncio.gather(*together) == [[PUBLIC], [PUBLIC]]
    assert await recent("example.com", 22) == [PUBLIC]
    assert asked == ["example.com"]
    with pytest.raises(socket.gaierror):
        await recent("nowhere.example.com", 80)
    assert await recent("nowhere.example.com", 80) == [PUBLIC]
    assert asked.count("nowhere.example.com") == 2
    recent.MAX_AGE = -1.0  # every answer is old now
    await recent("example.com", 80)
    assert asked.count("example.com") == 2


async def test_only_so_many_names_are_kept() -> None:
    asked: list[str] = []
    recent = RecentAnswers(
        resolver_to({"a.example.com": [PUBLIC], "b.example.com": [PUBLIC]}, asked)
    )
    recent.MAX_NAMES = 1
    await recent("a.example.com", 80)
    await recent("b.example.com", 80)
    await recent("a.example.com", 80)
    assert asked == ["a.example.com", "b.example.com", "a.example.com"]
