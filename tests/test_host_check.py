"""DNS rebinding, as an attacker's page would try it: a name of the attacker's own, pointed at
127.0.0.1, reaches the gateway through the owner's browser with that name in the Host header."""

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from boxd.dbus.client import GatewayClient
from boxd.web.app import make_app
from boxd.web.host_check import host_name, is_loopback_host


class FakeManager(GatewayClient):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def call_as(self, token: str, member: str, *args: Any) -> Any:
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


def test_the_name_is_read_without_its_port() -> None:
    assert host_name("[::1]:7700") == "[::1]"
    assert host_name("127.0.0.1:7700") == "127.0.0.1"
    assert host_name("::1") == "::1"
    assert not is_loopback_host(None)
    assert not is_loopback_host("")
    assert not is_loopback_host("[::1")
