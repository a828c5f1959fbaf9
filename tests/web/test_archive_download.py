"""GET /api/workspaces/{name}/archive (boxd/web/archive_download.py): the pipe the manager answers
with is sent as it is filled, and a client that goes away closes it so the manager's writer ends.
The manager here is a stand-in that fills a real pipe from a thread, as the manager does."""

import asyncio
import io
import os
import tarfile
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from boxd.dbus.client import GatewayClient
from boxd.dbus.interface import Method
from boxd.errors import Problem, die
from boxd.web.app import make_app

PART = b"x" * (1 << 20)


class PipeManager(GatewayClient):
    def __init__(self, parts: int) -> None:
        self.parts = parts
        self.asked: list[tuple[Any, ...]] = []
        self.ended = threading.Event()
        self.broken = False

    async def call_for_fd_as(self, token: str, method: Method, *args: Any) -> tuple[Any, int]:
        self.asked.append((token, method.name, *args))
        if args[0] != "site":
            die(Problem.NOT_FOUND, "there is no workspace 'other'")
        read_end, write_end = os.pipe()
        threading.Thread(target=self._fill, args=(write_end,), daemon=True).start()
        return {"workspace": "site", "path": args[1], "filename": "site-docs.tar"}, read_end

    def _fill(self, fd: int) -> None:
        """A tar of one file of `parts` MiB, as archive.write_archive would write it."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo("site-docs/big")
            info.size = self.parts * len(PART)
            tar.addfile(info, io.BytesIO(PART * self.parts))
        try:
            view = memoryview(buffer.getvalue())
            while view:
                view = view[os.write(fd, view[: 1 << 16]) :]
        except BrokenPipeError:
            self.broken = True
        finally:
            os.close(fd)
            self.ended.set()


@pytest.fixture
async def gateway(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[TestClient[Any, Any], PipeManager]]:
    manager = PipeManager(getattr(request, "param", 4))
    async with TestClient(TestServer(make_app(manager))) as client:
        yield client, manager


OWNER = {"Authorization": "Bearer box_owner"}


async def test_the_archive_is_sent_as_an_attachment_as_it_is_made(
    gateway: tuple[TestClient[Any, Any], PipeManager],
) -> None:
    client, manager = gateway
    response = await client.get("/api/workspaces/site/archive/docs/a%20b", headers=OWNER)
    assert response.status == 200
    assert response.headers["Content-Type"] == "application/x-tar"
    assert response.headers["Content-Disposition"] == 'attachment; filename="site-docs.tar"'
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "Content-Length" not in response.headers  # chunked: sent as it is made
    body = await response.read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        big = tar.extractfile("site-docs/big")
        assert big is not None and big.read() == PART * 4
    assert manager.asked == [("box_owner", "OpenWorkspaceArchive", "site", "docs/a b")]


async def test_the_whole_workspace_asks_for_the_root(
    gateway: tuple[TestClient[Any, Any], PipeManager],
) -> None:
    client, manager = gateway
    response = await client.get("/api/workspaces/site/archive", headers=OWNER)
    assert response.status == 200
    await response.read()
    assert manager.asked == [("box_owner", "OpenWorkspaceArchive", "site", "")]


async def test_a_refusal_is_the_usual_error(
    gateway: tuple[TestClient[Any, Any], PipeManager],
) -> None:
    client, _ = gateway
    response = await client.get("/api/workspaces/other/archive", headers=OWNER)
    assert response.status == 404
    assert response.headers["Content-Type"].startswith("application/json")
    response = await client.get("/api/workspaces/site/archive")
    assert response.status == 401


@pytest.mark.parametrize("gateway", [64], indirect=True)
async def test_a_client_that_goes_away_ends_the_managers_writer(
    gateway: tuple[TestClient[Any, Any], PipeManager],
) -> None:
    client, manager = gateway
    response = await client.get("/api/workspaces/site/archive", headers=OWNER)
    assert response.status == 200
    await response.content.readexactly(1 << 20)
    response.close()  # 63 MiB still unsent
    assert await asyncio.to_thread(manager.ended.wait, 30)
    assert manager.broken
