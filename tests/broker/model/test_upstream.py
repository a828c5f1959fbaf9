"""Where the model key may go (boxd.broker.model.upstream): the address modelBaseUrl's host
resolves to, screened as a task's egress is, each time a connection is made."""

import ipaddress
import socket

import pytest

from boxd.broker.model import upstream as model_upstream
from boxd.broker.model.upstream import ScreenedResolver, UpstreamRefused, refusal

OWN = {ipaddress.ip_address("192.0.2.10")}


@pytest.mark.parametrize(
    ("host", "address", "words"),
    [
        ("api.anthropic.com", "160.79.104.10", None),
        ("model.test", "198.18.0.2", None),
        # DNS that turns a public name into a neighbour, the box or its loopback: refused.
        ("api.anthropic.com", "169.254.169.254", "a link-local address"),
        ("api.anthropic.com", "127.0.0.1", "a loopback address: the model key never goes to"),
        ("api.anthropic.com", "10.0.0.5", "only when Settings modelBaseUrl names it"),
        ("api.anthropic.com", "::ffff:10.0.0.5", "the IPv4-mapped form of 10.0.0.5"),
        ("api.anthropic.com", "192.0.2.10", "this box's own address"),
        ("api.anthropic.com", "100.100.100.200", "a cloud metadata service's address"),
        # Named by the owner: that private address, this machine's loopback.
        ("10.0.0.5", "10.0.0.5", None),
        ("localhost", "127.0.0.1", None),
        ("localhost", "::1", None),
        ("127.0.0.1", "127.0.0.1", None),
        ("localhost", "10.0.0.5", "not this machine's loopback, which the URL names"),
    ],
)
def test_where_the_key_may_go(host: str, address: str, words: str | None) -> None:
    why = refusal(host, ipaddress.ip_address(address), OWN)
    if words is None:
        assert why is None
    else:
        assert why is not None and words in why


async def test_a_name_with_one_bad_address_is_refused_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def answers(name: str, port: int) -> list[ipaddress.IPv4Address]:
        return [ipaddress.IPv4Address("160.79.104.10"), ipaddress.IPv4Address("10.1.2.3")]

    async def own() -> set[ipaddress.IPv4Address]:
        return set()

    monkeypatch.setattr(model_upstream, "system_resolver", answers)
    resolver = ScreenedResolver()
    monkeypatch.setattr(resolver, "_own", own)
    with pytest.raises(UpstreamRefused) as refused:
        await resolver.resolve("api.anthropic.com", 443, socket.AF_INET)
    assert str(refused.value).startswith("api.anthropic.com resolves to 10.1.2.3, a private")
    with pytest.raises(UpstreamRefused, match=r"169\.254\.1\.1 is a link-local address"):
        await resolver.check_url_host("169.254.1.1")
    await resolver.check_url_host("api.anthropic.com")


async def test_the_addresses_it_gives_are_the_ones_it_screened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def answers(name: str, port: int) -> list[ipaddress.IPv6Address]:
        return [ipaddress.IPv6Address("2607:6bc0::10")]

    async def own() -> set[ipaddress.IPv4Address]:
        return set()

    monkeypatch.setattr(model_upstream, "system_resolver", answers)
    resolver = ScreenedResolver()
    monkeypatch.setattr(resolver, "_own", own)
    (found,) = await resolver.resolve("api.anthropic.com", 443, socket.AF_INET6)
    assert (found["host"], found["port"], found["family"]) == (
        "2607:6bc0::10",
        443,
        socket.AF_INET6,
    )
