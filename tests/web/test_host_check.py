"""DNS rebinding, as an attacker's page would try it: a name of the attacker's own, pointed at
127.0.0.1, reaches the gateway through the owner's browser with that name in the Host header."""

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from boxd.dbus.client import GatewayClient
from boxd.dbus.interface import GATEWAY, Method, bound_on
from boxd.web.app import make_app
from boxd.web.host_check import OTHER_ORIGIN, is_loopback_host


class FakeManager(GatewayClient):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def call_as(self, token: str, method: Method, *args: Any) -> Any:
        member = bound_on(GATEWAY, method).name
        self.calls.append(member)
        return {"version": "0"}


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[TestClient[Any, Any], FakeManager]]:
    manager = FakeManager()
    async with TestClient(TestServer(make_app(manager))) as client:
        yield client, manager


@pytest.mark.parametrize(
    "host",
    ["evil.example", "evil.example:7700", "127.0.0.1.evil.example", "localhost.evil", "0.0.0.0"],
)
async def test_another_name_is_refused_before_anything_is_asked(
    gateway: tuple[TestClient[Any, Any], FakeManager], host: str
) -> None:
    client, manager = gateway
    for path in ("/", "/api/openapi.json", "/api/tasks"):
        response = await client.get(path, headers={"Host": host, "Authorization": "Bearer x"})
        assert response.status == 403
        body = await response.json()
        assert "answers only to its own names" in body["error"]
        assert host in body["error"]
    assert manager.calls == []


@pytest.mark.parametrize("host", ["127.0.0.1:7700", "localhost:8080", "[::1]:7700", "LOCALHOST."])
async def test_own_names_on_any_port_are_served(
    gateway: tuple[TestClient[Any, Any], FakeManager], host: str
) -> None:
    client, manager = gateway
    response = await client.get("/api/droid", headers={"Host": host, "Authorization": "Bearer x"})
    assert response.status == 200, await response.text()
    assert manager.calls == ["GetDroid"]


@pytest.mark.parametrize(
    "host",
    [
        "[::1%25lo]",
        "[::1%lo]:7700",
        "[fe80::1%25lo]",
        "[::1]evil.example",
        "[::1]:7700x",
        "127.0.0.1:evil",
        "127.0.0.1:",
        "localhost..",
        "::1",
        "[::1",
        "127.0.0.1:7700:7700",
        "127.0.0.1 evil.example",
    ],
)
async def test_a_name_that_only_begins_like_ours_is_refused(
    gateway: tuple[TestClient[Any, Any], FakeManager], host: str
) -> None:
    """A zone id, junk after the bracket or a port that is not one: not this box's name."""
    client, manager = gateway
    response = await client.get("/api/droid", headers={"Host": host, "Authorization": "Bearer x"})
    assert response.status == 403, host
    assert "answers only to its own names" in (await response.json())["error"]
    assert manager.calls == []


async def test_a_second_host_header_is_refused(
    gateway: tuple[TestClient[Any, Any], FakeManager],
) -> None:
    """Two Host headers, ours first: a proxy that reads the last one sends it elsewhere. Sent
    by hand, as an HTTP client merges them. aiohttp's parser refuses it before the gateway's
    own check could read the first one."""
    client, manager = gateway
    for second in ("evil.example", "127.0.0.1"):
        reader, writer = await asyncio.open_connection(client.host, client.port)
        writer.write(
            b"GET /api/droid HTTP/1.1\r\nHost: 127.0.0.1:7700\r\nHost: "
            + second.encode()
            + b"\r\nAuthorization: Bearer x\r\nConnection: close\r\n\r\n"
        )
        answer = await reader.read()
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.split(b" ")[1] == b"400", answer
        assert json.loads(body)["error"] == (
            "the request sends its Host header more than once: send it once"
        ), body
    assert manager.calls == []


def test_what_is_not_a_header_is_not_our_name() -> None:
    assert is_loopback_host("127.0.0.1:7700")
    assert is_loopback_host(" localhost ")
    assert not is_loopback_host(None)
    assert not is_loopback_host("")
    assert not is_loopback_host("[::1")


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1:8766",
        "http://localhost:7700",
        "http://evil.example",
        "null",
        "https://127.0.0.1:7700",
    ],
)
async def test_a_page_of_another_origin_is_refused_before_anything_is_asked(
    gateway: tuple[TestClient[Any, Any], FakeManager], origin: str
) -> None:
    """Another port of 127.0.0.1 is another origin: its page cannot trade a login link or a
    pairing code through the owner's browser, nor act with a token it was given."""
    client, manager = gateway
    for method, path in (("POST", "/api/session"), ("POST", "/api/pair"), ("GET", "/api/droid")):
        headers = {"Host": "127.0.0.1:7700", "Origin": origin, "Authorization": "Bearer x"}
        response = await client.request(method, path, headers=headers, json={"code": "x"})
        assert response.status == 403, (origin, path)
        assert (await response.json())["error"] == OTHER_ORIGIN.format(
            own="http://127.0.0.1:7700", origin=repr(origin)
        )
    assert manager.calls == []


async def test_a_page_of_this_address_and_a_client_with_no_origin_are_served(
    gateway: tuple[TestClient[Any, Any], FakeManager],
) -> None:
    client, manager = gateway
    for host, origin in (("127.0.0.1:7700", "http://127.0.0.1:7700"), ("localhost:8080", None)):
        headers = {"Host": host, "Authorization": "Bearer x"}
        if origin is not None:
            headers["Origin"] = origin
        response = await client.get("/api/droid", headers=headers)
        assert response.status == 200, await response.text()
    assert manager.calls == ["GetDroid", "GetDroid"]
