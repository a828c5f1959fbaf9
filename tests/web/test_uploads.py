"""The owner's uploads over HTTP (boxd/web/uploads.py), the real aiohttp app on a real socket: what
comes in (one file's bytes, multipart parts with folder paths, a tar or gzip tar) goes to the
manager as a tar stream through a pipe. The manager here is its own reader of that stream
(tar_upload.add_tar, into a staged layer), called in a thread as AddToWorkspace would be; the
rest of the manager is the bus stand-in. A manager that refuses before reading it all answers
at once, without the gateway writing on into a pipe no one reads."""

import gzip
import io
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from boxd.dbus.client import GatewayClient
from boxd.errors import Problem, die
from boxd.manager.workspaces.owner_layer import Made, stage, throw_away
from boxd.manager.workspaces.stack_view import Level, Stack
from boxd.manager.workspaces.tar_upload import add_tar
from boxd.web import uploads
from boxd.web.app import make_app
from tests.support.layer_marks import MARKS
from tests.support.manager_on_the_bus import OWNER, TASK, ManagerOnTheBus

HEADERS = {"Authorization": f"Bearer {OWNER}"}
Gateway = tuple[aiohttp.ClientSession, URL, list[Made]]


@pytest.fixture
async def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    base = tmp_path / "base"
    base.mkdir()
    stack = Stack([Level(None, base)], MARKS)
    made: list[Made] = []

    async def add(client: GatewayClient, token: str, name: str, folder: str, fd: int) -> Any:
        import asyncio

        layer = stage(tmp_path / "store", -1)
        made.append(layer)
        await asyncio.to_thread(add_tar, layer, stack, folder, fd)
        return {**TASK, "workspace": name}

    monkeypatch.setattr(uploads, "add_to_workspace", add)
    app: web.Application = make_app(GatewayClient(ManagerOnTheBus()))  # type: ignore[arg-type]
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        yield session, server.make_url(""), made
    for layer in made:
        throw_away(layer)


def a_tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return out.getvalue()


async def test_put_one_file(gateway: Gateway) -> None:
    session, root, made = gateway
    url = root / "api/workspaces/home/files/docs/notes.md"
    async with session.put(url, data=b"hello\n", headers=HEADERS) as answer:
        assert answer.status == 201, await answer.text()
        assert (await answer.json())["workspace"] == "home"
    assert (made[0].path / "docs/notes.md").read_bytes() == b"hello\n"


async def test_a_big_file_streams_through(gateway: Gateway) -> None:
    session, root, made = gateway
    body = os.urandom(8 << 20)
    url = root / "api/workspaces/home/files/big.bin"
    async with session.put(url, data=body, headers=HEADERS) as answer:
        assert answer.status == 201, await answer.text()
    assert (made[0].path / "big.bin").read_bytes() == body


def browser_form(*parts: tuple[str, str | None, bytes]) -> tuple[bytes, dict[str, str]]:
    """multipart/form-data as a browser sends a folder picked whole: each file's relative path
    in its filename, as it is (aiohttp's own client would escape the slashes)."""
    boundary = "----boxdtestboundary"
    body = b""
    for name, filename, content in parts:
        named = f'; filename="{filename}"' if filename is not None else ""
        body += (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"{named}\r\n'
                "Content-Type: application/octet-stream\r\n\r\n"
            ).encode()
            + content
            + b"\r\n"
        )
    body += f"--{boundary}--\r\n".encode()
    return body, {**HEADERS, "Content-Type": f"multipart/form-data; boundary={boundary}"}


async def test_multipart_with_a_folder_picked_whole(gateway: Gateway) -> None:
    session, root, made = gateway
    form, headers = browser_form(
        ("file", "pics/a.txt", b"a"),
        ("file", "pics/inner/b.txt", b"bb"),
        ("note", None, b"a plain field, not a file"),
    )
    url = root / "api/workspaces/home/files/up"
    async with session.post(url, data=form, headers=headers) as a:
        assert a.status == 201, await a.text()
    assert (made[0].path / "up/pics/inner/b.txt").read_bytes() == b"bb"
    assert (made[0].path / "up/pics/a.txt").read_bytes() == b"a"


@pytest.mark.parametrize("kind", ["application/x-tar", "application/gzip"])
async def test_a_tar_body(gateway: Gateway, kind: str) -> None:
    session, root, made = gateway
    body = a_tar({"x/y.md": b"y"})
    if kind == "application/gzip":
        body = gzip.compress(body)
    headers = {**HEADERS, "Content-Type": kind}
    async with session.post(root / "api/workspaces/home/files", data=body, headers=headers) as a:
        assert a.status == 201, await a.text()
    assert (made[0].path / "x/y.md").read_bytes() == b"y"


async def test_a_hostile_tar_is_refused_in_the_managers_words(gateway: Gateway) -> None:
    session, root, _ = gateway
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        link = tarfile.TarInfo("etc")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc"
        archive.addfile(link)
    headers = {**HEADERS, "Content-Type": "application/x-tar"}
    url = root / "api/workspaces/home/files"
    async with session.post(url, data=out.getvalue(), headers=headers) as answer:
        assert answer.status == 400
        assert "symbolic link" in (await answer.json())["error"]


async def test_a_refusal_before_the_body_is_read_answers_at_once(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manager refuses (a workspace that is not there) without reading: a 64 MiB body does
    not leave the gateway writing into a full pipe."""
    session, root, _ = gateway

    async def refuse(client: GatewayClient, token: str, name: str, folder: str, fd: int) -> Any:
        die(Problem.NOT_FOUND, f"no workspace {name}")

    monkeypatch.setattr(uploads, "add_to_workspace", refuse)
    url = root / "api/workspaces/nope/files/big.bin"
    async with session.put(url, data=b"\0" * (64 << 20), headers=HEADERS) as answer:
        assert answer.status == 404
        assert (await answer.json())["error"] == "no workspace nope"


async def test_what_is_not_an_upload_is_refused(gateway: Gateway) -> None:
    session, root, _ = gateway
    url = root / "api/workspaces/home/files"
    headers = {**HEADERS, "Content-Type": "text/plain"}
    async with session.post(url, data=b"hello", headers=headers) as answer:
        assert answer.status == 400
        assert "multipart/form-data" in (await answer.json())["error"]
    form, headers = browser_form(("note", None, b"no file here"))
    async with session.post(url, data=form, headers=headers) as answer:
        assert answer.status == 400
        assert "holds no files" in (await answer.json())["error"]


async def test_delete_and_rename_reach_the_manager(gateway: Gateway) -> None:
    session, root, _ = gateway
    url = root / "api/workspaces/home/files/a.md"
    async with session.delete(url, headers=HEADERS) as answer:
        assert answer.status == 201, await answer.text()
    url = root / "api/workspaces/home/rename"
    async with session.post(url, json={"from": "a.md", "to": "b.md"}, headers=HEADERS) as answer:
        assert answer.status == 201, await answer.text()
    async with session.post(url, json={"from": "../a", "to": "b.md"}, headers=HEADERS) as answer:
        assert answer.status == 400
    async with session.post(url, json={"from": "a.md"}, headers=HEADERS) as answer:
        assert answer.status == 400
