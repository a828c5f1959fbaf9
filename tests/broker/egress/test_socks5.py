import asyncio
import ipaddress
import logging
import struct

import pytest

from tests.support.egress_fixtures import echo, egress, free_port, server


def domain(name: str, port: int) -> bytes:
    return bytes([3, len(name)]) + name.encode() + struct.pack("!H", port)


def ipv4(text: str, port: int) -> bytes:
    return bytes([1]) + ipaddress.IPv4Address(text).packed + struct.pack("!H", port)


def ipv6(text: str, port: int) -> bytes:
    return bytes([4]) + ipaddress.IPv6Address(text).packed + struct.pack("!H", port)


async def socks(
    port: int, address: bytes, command: int = 1, methods: bytes = b"\x00"
) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    """Greets, sends one request; returns the reply's code and the open connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(bytes([5, len(methods)]) + methods)
    assert await reader.readexactly(2) == b"\x05\x00"
    writer.write(bytes([5, command, 0]) + address)
    head = await reader.readexactly(4)
    assert head[0] == 5 and head[2] == 0
    await reader.readexactly(4 if head[3] == 1 else 16)
    await reader.readexactly(2)
    return head[1:2], reader, writer


async def test_connect_by_name_tunnels_bytes_both_ways() -> None:
    async with server(echo) as origin, egress(["example.com"], "socks") as proxy:
        code, reader, writer = await socks(proxy.port, domain("example.com", origin))
        writer.write(b"hello")
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 10) == b"hellobye"
        writer.close()
    assert code == b"\x00"
    assert proxy.refusals == []


async def refused(hosts: list[str], address: bytes, command: int = 1) -> tuple[bytes, list[str]]:
    async with egress(hosts, "socks") as proxy:
        code, reader, writer = await socks(proxy.port, address, command)
        # The proxy closes after a refusal.
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
    assert len(proxy.refusals) == 1
    return code, list(proxy.refusals[0])


async def test_an_unlisted_host_gets_not_allowed_by_ruleset() -> None:
    code, refusal = await refused(["example.com"], domain("other.example.org", 443))
    assert code == b"\x02"
    assert refusal == ["other.example.org:443", "it is not in this task's hosts"]


async def test_a_wildcard_allows_subdomains_only() -> None:
    async with server(echo) as origin, egress(["*.example.com"], "socks") as proxy:
        code, _, writer = await socks(proxy.port, domain("a.example.com", origin))
        writer.close()
    assert code == b"\x00"
    code, _ = await refused(["*.example.com"], domain("example.com", origin))
    assert code == b"\x02"


async def test_ip_literals_are_refused_unless_listed() -> None:
    code, refusal = await refused(["example.com"], ipv4("93.184.216.34", 443))
    assert code == b"\x02"
    assert refusal[0] == "93.184.216.34:443"
    code, refusal = await refused(["example.com"], ipv6("2001:db8::1", 443))
    assert code == b"\x02"
    assert refusal == [
        "[2001:db8::1]:443",
        "it is an IP address, and this task's hosts do not list that address",
    ]


async def test_a_name_resolving_to_loopback_is_refused_with_the_production_check() -> None:
    async with egress(["example.com"], "socks", production_check=True) as proxy:
        code, _, writer = await socks(proxy.port, domain("example.com", 443))
        writer.close()
    assert code == b"\x02"
    assert proxy.refusals == [
        (
            "example.com:443",
            "example.com resolves to 127.0.0.1, a loopback address: tasks never reach the box "
            "itself",
        )
    ]


async def test_udp_associate_and_bind_are_refused_as_not_supported() -> None:
    code, refusal = await refused(["example.com"], ipv4("0.0.0.0", 0), command=3)
    assert code == b"\x07"
    assert refusal == [
        "0.0.0.0:0",
        "SOCKS5 UDP ASSOCIATE is not supported; this proxy only connects (CONNECT)",
    ]
    code, refusal = await refused(["example.com"], domain("example.com", 80), command=2)
    assert code == b"\x07"
    assert refusal[1].startswith("SOCKS5 BIND is not supported")


async def test_a_target_that_refuses_the_connection_gets_connection_refused() -> None:
    port = await free_port()
    async with egress(["example.com", "*.example.com"], "socks") as proxy:
        code, _, writer = await socks(proxy.port, domain("example.com", port))
        writer.close()
        code_dns, _, writer = await socks(proxy.port, domain("nowhere.example.com", 80))
        writer.close()
    assert code == b"\x05"
    assert code_dns == b"\x04"
    assert proxy.refusals == []


async def test_a_client_that_wants_authentication_gets_no_acceptable_method() -> None:
    async with egress(["example.com"], "socks") as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"\x05\x01\x02")
        assert await asyncio.wait_for(reader.read(), 10) == b"\x05\xff"
        writer.close()


async def test_an_unknown_address_type_gets_its_reply() -> None:
    async with egress(["example.com"], "socks") as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"\x05\x01\x00" + b"\x05\x01\x00\x09")
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    assert answer[:4] == b"\x05\x00\x05\x08"


async def test_not_socks5_is_closed_without_a_word() -> None:
    async with egress(["example.com"], "socks") as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()


async def test_replies_never_tell_the_broker_address() -> None:
    async with server(echo) as origin, egress(["example.com"], "socks") as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"\x05\x01\x00" + b"\x05\x01\x00" + domain("example.com", origin))
        answer = await asyncio.wait_for(reader.readexactly(12), 10)
        writer.close()
    assert answer == b"\x05\x00" + b"\x05\x00\x00\x01" + bytes(6)


async def test_bytes_sent_with_the_request_are_not_lost() -> None:
    # Clients that pipeline (greeting, request and first bytes at once) lose nothing: what the
    # proxy read past the request goes out first.
    async with server(echo) as origin, egress(["example.com"], "socks") as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"\x05\x01\x00" + b"\x05\x01\x00" + domain("example.com", origin) + b"early")
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    assert answer == b"\x05\x00" + b"\x05\x00\x00\x01" + bytes(6) + b"earlybye"


async def test_connections_over_the_limit_are_logged_once_a_minute_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A task at its cap that keeps connecting made a warning per connection: a flood in the
    journal (found by an attacker's review). Now the first is said at once and the rest, counted,
    in one line a minute after it (or as the broker stops)."""
    closed = "egress SOCKS connection closed: the task has 1 open, its most"
    crowd_size = 40
    with caplog.at_level(logging.WARNING, logger="boxd.broker.egress.socks5"):
        async with server(echo) as origin, egress(["example.com"], "socks") as proxy:
            proxy.egress.max_connections = 1
            code, _reader, writer = await socks(proxy.port, domain("example.com", origin))
            assert code == b"\x00"
            for _ in range(crowd_size):
                crowd_reader, crowd_writer = await asyncio.open_connection("127.0.0.1", proxy.port)
                assert await asyncio.wait_for(crowd_reader.read(), 10) == b""
                crowd_writer.close()
            said = [record.getMessage() for record in caplog.records]
            assert said == [closed]
            writer.close()
    said = [record.getMessage() for record in caplog.records]
    assert said == [closed, f"{closed} ({crowd_size - 1} more since the last such line)"]
