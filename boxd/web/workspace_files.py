"""The workspace as it stands, over HTTP: a folder's listing, a path's history, and a file's
bytes read from the descriptor the manager passes (never through a D-Bus message).

A file's bytes are a task's, an attacker's: they are served so no browser runs them. Text (UTF-8
with no NUL in its first bytes) goes as text/plain, a raster image (its magic bytes, not its
name) inline as itself, anything else as an attachment; always with nosniff and a sandboxing
Content-Security-Policy. One byte range (Range: bytes=...) is served as a 206, one past the
end as a 416.
"""

import asyncio
import os
from collections.abc import Callable
from urllib.parse import quote

from aiohttp import web

from boxd.dbus import interface as api
from boxd.dbus.client import GatewayClient, pages
from boxd.web.byte_ranges import Unsatisfiable, past_the_end, wanted_range
from boxd.web.json_stream import stream
from boxd.web.screen_session import token_of

ClientOf = Callable[[web.Request], GatewayClient]

# Bytes read and written at a time.
CHUNK = 1 << 20
# Bytes looked at to tell text from binary and an image's kind.
SNIFF = 8192
_IMAGES = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def kind_of(head: bytes) -> tuple[str, bool]:
    """The Content-Type to serve bytes beginning with `head` as, and whether inline."""
    for magic, kind in _IMAGES:
        if head.startswith(magic):
            return kind, True
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp", True
    if b"\x00" not in head:
        try:
            head.decode("utf-8")
            return "text/plain; charset=utf-8", True
        except UnicodeDecodeError as error:
            # Cut in the middle of a character at the end of what was looked at: still text.
            if error.start >= len(head) - 3 and error.reason == "unexpected end of data":
                return "text/plain; charset=utf-8", True
    return "application/octet-stream", False


def disposition(path: str, inline: bool) -> str:
    name = path.rsplit("/", 1)[-1]
    return f"{'inline' if inline else 'attachment'}; filename*=UTF-8''{quote(name, safe='')}"


def _path(request: web.Request) -> str:
    return request.match_info.get("path", "")


def add_routes(router: web.UrlDispatcher, client_of: ClientOf) -> None:
    async def list_files(request: web.Request) -> web.StreamResponse:
        token, name, path = token_of(request), request.match_info["name"], _path(request)
        client = client_of(request)
        listing = pages(
            lambda page: client.call_as(token, api.LIST_WORKSPACE_FILES, name, path, page)
        )
        return await stream(
            request,
            listing,
            "entries",
            lambda first: {k: v for k, v in first.items() if k not in ("entries", "next")},
        )

    async def history(request: web.Request) -> web.Response:
        token, name, path = token_of(request), request.match_info["name"], _path(request)
        found = await client_of(request).call_as(token, api.GET_WORKSPACE_FILE_HISTORY, name, path)
        return web.json_response(found)

    async def read_file(request: web.Request) -> web.StreamResponse:
        token, name, path = token_of(request), request.match_info["name"], _path(request)
        opened, fd = await client_of(request).call_for_fd_as(
            token, api.OPEN_WORKSPACE_FILE, name, path
        )
        try:
            size = opened.get("size") if isinstance(opened, dict) else None
            if not isinstance(size, int):
                size = os.fstat(fd).st_size
            return await serve_fd(request, fd, path, size)
        finally:
            os.close(fd)

    router.add_get("/api/workspaces/{name}/list", list_files)
    router.add_get("/api/workspaces/{name}/list/{path:.+}", list_files)
    router.add_get("/api/workspaces/{name}/files/{path:.+}", read_file)
    router.add_get("/api/workspaces/{name}/history/{path:.+}", history)


async def serve_fd(request: web.Request, fd: int, path: str, size: int) -> web.StreamResponse:
    """The open file's bytes as the answer, or the range asked for; `size` is the file's as
    the manager opened it: what it grew by since is left out."""
    head = await asyncio.to_thread(os.pread, fd, SNIFF, 0)
    kind, inline = kind_of(head)
    response = web.StreamResponse()
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Content-Security-Policy"] = "sandbox"
    response.headers["Accept-Ranges"] = "bytes"
    response.headers["Content-Disposition"] = disposition(path, inline)
    response.content_type = "application/octet-stream"
    response.headers["Content-Type"] = kind
    try:
        asked = wanted_range(request.headers.get("Range"), size)
    except Unsatisfiable:
        return web.json_response(
            {"error": past_the_end(size)},
            status=416,
            headers={"Content-Range": f"bytes */{size}", "X-Content-Type-Options": "nosniff"},
        )
    start, end = asked or (0, size)
    if asked is not None:
        response.set_status(206)
        response.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    response.content_length = end - start
    await response.prepare(request)
    if request.method == "HEAD":
        return response
    at = start
    while at < end:
        chunk = await asyncio.to_thread(os.pread, fd, min(CHUNK, end - at), at)
        if not chunk:
            # Shrunk while sent: the answer cannot be what its Content-Length said, so the
            # connection is closed rather than left to carry a next answer out of step.
            response.force_close()
            if request.transport is not None:
                request.transport.close()
            return response
        await response.write(chunk)
        at += len(chunk)
    await response.write_eof()
    return response
