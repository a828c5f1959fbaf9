"""The workspace's files over HTTP (boxd/web/workspace_files.py), with the manager stood in for
by a client that opens a temp file: ranges (206, 416, a 20-digit number), what a file is served
as (text, an image inline, else an attachment; nosniff and a sandbox always), HEAD with no body,
the descriptor closed after, and a file that shrinks while sent cutting the connection."""

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from boxd.dbus.client import GatewayClient
from boxd.dbus.interface import Method
from boxd.web.app import make_app
from boxd.web.byte_ranges import Unsatisfiable, wanted_range
from boxd.web.workspace_files import CHUNK, kind_of

HEADERS = {"Authorization": "Bearer x"}


class Manager(GatewayClient):
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.opened: list[int] = []

    async def call_as(self, token: str, method: Method, *args: Any) -> Any:
        return {"workspace": args[0], "path": args[1], "entries": [], "truncated": False}

    async def call_for_fd_as(self, token: str, method: Method, *args: Any) -> tuple[Any, int]:
        fd = os.open(self.folder / args[1], os.O_RDONLY)
        self.opened.append(fd)
        size = os.fstat(fd).st_size
        if args[1] == "shrinks":
            os.truncate(self.folder / "shrinks", CHUNK + 10)
        return {"path": args[1], "size": size}, fd


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[TestClient[Any, Any], Manager]]:
    (tmp_path / "notes.md").write_text("héllo\n" * 1000)
    (tmp_path / "pic.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    (tmp_path / "page.html").write_bytes(b"<script>alert(1)</script>\0")
    manager = Manager(tmp_path)
    async with TestClient(TestServer(make_app(manager))) as client:
        yield client, manager


def closed(fds: list[int]) -> bool:
    return all(not os.path.exists(f"/proc/self/fd/{fd}") for fd in fds)


async def test_a_text_file_is_served_as_text_sandboxed(
    served: tuple[TestClient[Any, Any], Manager],
) -> None:
    client, manager = served
    response = await client.get("/api/workspaces/docs/files/notes.md", headers=HEADERS)
    assert response.status == 200
    assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Content-Security-Policy"] == "sandbox"
    assert await response.text() == "héllo\n" * 1000
    assert closed(manager.opened)


async def test_an_image_is_inline_and_anything_else_an_attachment(
    served: tuple[TestClient[Any, Any], Manager],
) -> None:
    client, _ = served
    image = await client.get("/api/workspaces/docs/files/pic.png", headers=HEADERS)
    assert image.headers["Content-Type"] == "image/png"
    assert image.headers["Content-Disposition"].startswith("inline")
    page = await client.get("/api/workspaces/docs/files/page.html", headers=HEADERS)
    assert page.headers["Content-Type"] == "application/octet-stream"
    assert page.headers["Content-Disposition"] == "attachment; filename*=UTF-8''page.html"


async def test_ranges(served: tuple[TestClient[Any, Any], Manager]) -> None:
    client, manager = served
    url = "/api/workspaces/docs/files/notes.md"
    part = await client.get(url, headers={**HEADERS, "Range": "bytes=0-5"})
    assert part.status == 206 and await part.read() == "héllo".encode()
    assert part.headers["Content-Range"] == "bytes 0-5/7000"
    tail = await client.get(url, headers={**HEADERS, "Range": "bytes=-3"})
    assert tail.status == 206 and await tail.read() == b"lo\n"
    for past in ("bytes=7000-", "bytes=99999999999999999999-", "bytes=0-123456789012345678901"):
        refused = await client.get(url, headers={**HEADERS, "Range": past})
        assert refused.status == 416 and refused.headers["Content-Range"] == "bytes */7000"
    assert closed(manager.opened)


async def test_head_writes_no_body(served: tuple[TestClient[Any, Any], Manager]) -> None:
    client, manager = served
    response = await client.head("/api/workspaces/docs/files/notes.md", headers=HEADERS)
    assert response.status == 200 and response.headers["Content-Length"] == "7000"
    assert await response.read() == b""
    assert closed(manager.opened)


async def test_a_listing_is_json(served: tuple[TestClient[Any, Any], Manager]) -> None:
    client, _ = served
    response = await client.get("/api/workspaces/docs/list/sub/dir", headers=HEADERS)
    assert await response.json() == {
        "workspace": "docs",
        "path": "sub/dir",
        "entries": [],
        "truncated": False,
    }


async def test_a_file_that_shrinks_while_sent_cuts_the_connection(
    served: tuple[TestClient[Any, Any], Manager], tmp_path: Path
) -> None:
    client, manager = served
    (tmp_path / "shrinks").write_bytes(b"x" * (3 * CHUNK))
    response = await client.get("/api/workspaces/docs/files/shrinks", headers=HEADERS)
    assert response.headers["Content-Length"] == str(3 * CHUNK)
    with pytest.raises(aiohttp.ClientPayloadError):
        await response.read()
    # The connection is not used again: the next answer comes whole on a new one.
    again = await client.get("/api/workspaces/docs/files/notes.md", headers=HEADERS)
    assert len(await again.read()) == 7000
    assert closed(manager.opened)


def test_wanted_range() -> None:
    assert wanted_range(None, 10) is None
    assert wanted_range("bytes=2-4", 10) == (2, 5)
    assert wanted_range("bytes=2-", 10) == (2, 10)
    assert wanted_range("bytes=-20", 10) == (0, 10)
    assert wanted_range("bytes=0-5,7-8", 10) is None  # several: the whole file
    assert wanted_range("items=1-2", 10) is None
    for past in ("bytes=10-", "bytes=-0", "bytes=" + "9" * 20 + "-"):
        with pytest.raises(Unsatisfiable):
            wanted_range(past, 10)
    with pytest.raises(Unsatisfiable):
        wanted_range("bytes=0-", 0)


def test_kind_of() -> None:
    assert kind_of("naïve".encode()[:-1]) == ("text/plain; charset=utf-8", True)
    assert kind_of(b"a\0b") == ("application/octet-stream", False)
    assert kind_of(b"\xff\xd8\xff\xe0") == ("image/jpeg", True)
    assert kind_of(b"<svg onload=alert(1)>")[0] == "text/plain; charset=utf-8"
