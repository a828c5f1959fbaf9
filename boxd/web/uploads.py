"""The owner's changes over HTTP: uploads, deletions and renames in a workspace, each an owner's
change of its own (boxd.manager.owner_changes), answered 201 with it as a task.

An upload reaches the manager as a tar stream through a pipe, never inside a D-Bus message: the
web process writes what it receives into the pipe as it comes, and the manager reads the other
end and checks every entry (names, kinds, caps) as an attacker's. PUT sends one file's bytes
(`curl -T`); POST sends multipart/form-data (several files; a part's filename may hold a
relative path, as a browser sends a folder picked whole) or a tar, plain or gzip-compressed,
passed through as it came. The body is streamed, so the 10 MB cap of the JSON routes does not
apply; the manager's caps do (owner_layer.MAX_ENTRIES, MAX_BYTES).
"""

import asyncio
import os
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, BinaryIO

from aiohttp import BodyPartReader, MultipartReader, web

from boxd.dbus import interface as api
from boxd.dbus.client import GatewayClient
from boxd.errors import Problem, die
from boxd.web.screen_session import token_of
from boxd.wire.models.owner_requests import RenameRequest
from boxd.wire.models.plain_errors import parse

# What the manager may take in one change: more is refused here before anything is sent.
MAX_UPLOAD_BYTES = 1024 * 1024 * 1024
_CHUNK = 1 << 20
_TAR_TYPES = ("application/x-tar", "application/tar")
_GZIP_TYPES = (
    "application/gzip",
    "application/x-gzip",
    "application/x-gtar",
    "application/tar+gzip",
)

# How the web process hands a pipe's read end to the manager's AddToWorkspace.
AddCall = Callable[[GatewayClient, str, str, str, int], Awaitable[Any]]


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, int(time.time())
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _padding(size: int) -> bytes:
    return b"\0" * (-size % tarfile.BLOCKSIZE)


_END = b"\0" * (2 * tarfile.BLOCKSIZE)


async def _one_file(name: str, size: int, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A tar of one file whose size is known before its bytes come."""
    yield _header(name, size)
    sent = 0
    async for chunk in body:
        sent += len(chunk)
        if sent > size:
            die(Problem.INVALID, "the body is longer than its Content-Length")
        yield chunk
    if sent != size:
        die(Problem.INVALID, "the body ended before its Content-Length; nothing was added")
    yield _padding(size) + _END


async def _chunks(request: web.Request) -> AsyncIterator[bytes]:
    async for chunk in request.content.iter_chunked(_CHUNK):
        yield chunk


async def _spooled(part: BodyPartReader, total: list[int]) -> BinaryIO:
    """A part of unknown length, in a temporary file of this process's own (its length must
    be in the tar header before its bytes)."""
    spool: BinaryIO = tempfile.TemporaryFile()  # noqa: SIM115 (closed by the caller)
    try:
        while chunk := await part.read_chunk(_CHUNK):
            total[0] += len(chunk)
            if total[0] > MAX_UPLOAD_BYTES:
                die(
                    Problem.INVALID,
                    f"one change holds at most {MAX_UPLOAD_BYTES >> 20} MiB of files: this "
                    "one has more; nothing was added",
                )
            await asyncio.to_thread(spool.write, chunk)
        spool.seek(0)
    except BaseException:
        spool.close()
        raise
    return spool


async def _multipart(reader: MultipartReader) -> AsyncIterator[bytes]:
    """A tar of every file part, each under the filename it came with (a relative path, when a
    browser sends a folder)."""
    total = [0]
    sent = 0
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            die(Problem.INVALID, "a part of the upload is itself multipart: send files only")
        if part.filename is None:
            continue  # a plain form field: not a file
        spool = await _spooled(part, total)
        try:
            size = os.fstat(spool.fileno()).st_size
            yield _header(part.filename, size)
            while chunk := await asyncio.to_thread(spool.read, _CHUNK):
                yield chunk
            yield _padding(size)
            sent += 1
        finally:
            spool.close()
    if sent == 0:
        die(Problem.INVALID, "the upload holds no files: send them as parts with a filename")
    yield _END


class _Answered(Exception):
    """The manager answered before it read all of the stream: a refusal, most likely."""


async def _write(fd: int, data: bytes, call: "asyncio.Future[Any]") -> None:
    """Writes into the pipe without blocking the loop, and stops once the manager answered,
    which it may do before reading everything (a refusal)."""
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    while view:
        if call.done():
            raise _Answered
        try:
            view = view[os.write(fd, view) :]
            continue
        except BlockingIOError:
            pass
        writable: asyncio.Future[None] = loop.create_future()
        loop.add_writer(fd, _ready, writable)
        try:
            await asyncio.wait((writable, call), return_when=asyncio.FIRST_COMPLETED)
        finally:
            loop.remove_writer(fd)
            writable.cancel()


def _ready(writable: "asyncio.Future[None]") -> None:
    if not writable.done():
        writable.set_result(None)


async def send(
    client: GatewayClient,
    token: str,
    add: AddCall,
    name: str,
    folder: str,
    stream: AsyncIterator[bytes],
) -> web.Response:
    """Calls AddToWorkspace with a pipe's read end while `stream` goes into its write end. The
    manager may refuse before it has read everything: its words are the answer."""
    read, write = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(write, False)
    call = asyncio.ensure_future(add(client, token, name, folder, read))
    failure: BaseException | None = None
    try:
        # Each chunk raced with the manager's answer: a client that stops sending is given up on
        # when the manager gives up on the pipe (tar_upload.IDLE_SECONDS), not waited for.
        chunks = stream.__aiter__()
        while True:
            following = asyncio.ensure_future(chunks.__anext__())
            await asyncio.wait((following, call), return_when=asyncio.FIRST_COMPLETED)
            if not following.done():
                following.cancel()
                raise _Answered
            try:
                chunk = following.result()
            except StopAsyncIteration:
                break
            await _write(write, chunk, call)
    except _Answered:
        pass
    except BaseException as error:
        failure = error
    finally:
        # The end of the stream, or where it was cut off: the manager sees which.
        os.close(write)
    try:
        answer = await call
    except BaseException:
        if failure is not None:
            raise failure from None
        raise
    finally:
        os.close(read)
    if failure is not None:
        raise failure
    return web.json_response(answer, status=201)


def _path(request: web.Request) -> str:
    return request.match_info.get("path", "")


async def put_file(client: GatewayClient, add: AddCall, request: web.Request) -> web.Response:
    """PUT /api/workspaces/{name}/files/{path}: the body is the file."""
    token = token_of(request)
    path = _path(request)
    folder, _, file_name = path.rpartition("/")
    size = request.content_length
    if size is None:
        die(Problem.INVALID, "send the file with a Content-Length (curl -T sends one)")
    if size > MAX_UPLOAD_BYTES:
        die(
            Problem.INVALID,
            f"one change holds at most {MAX_UPLOAD_BYTES >> 20} MiB of files: this one has "
            "more; nothing was added",
        )
    if not file_name:
        die(Problem.INVALID, "name the file: PUT /api/workspaces/{name}/files/{path}")
    stream = _one_file(file_name, size, _chunks(request))
    return await send(client, token, add, request.match_info["name"], folder, stream)


async def post_files(client: GatewayClient, add: AddCall, request: web.Request) -> web.Response:
    """POST /api/workspaces/{name}/files[/{folder}]: multipart files, or a tar (gzip too)."""
    token = token_of(request)
    kind = request.content_type
    name, folder = request.match_info["name"], _path(request)
    if kind.startswith("multipart/"):
        stream = _multipart(await request.multipart())
    elif kind in _TAR_TYPES or kind in _GZIP_TYPES:
        stream = _chunks(request)
    else:
        die(
            Problem.INVALID,
            f"an upload is multipart/form-data, or a tar (application/x-tar, or gzip-compressed "
            f"as application/gzip), not {kind or 'a body with no Content-Type'}",
        )
    return await send(client, token, add, name, folder, stream)


async def delete_file(client: GatewayClient, request: web.Request) -> web.Response:
    task = await client.call_as(
        token_of(request), api.DELETE_FROM_WORKSPACE, request.match_info["name"], _path(request)
    )
    return web.json_response(task, status=201)


async def rename(client: GatewayClient, request: web.Request) -> web.Response:
    token = token_of(request)
    body = parse(RenameRequest, await request.read())
    task = await client.call_as(
        token,
        api.RENAME_IN_WORKSPACE,
        request.match_info["name"],
        body.from_,
        body.to,
    )
    return web.json_response(task, status=201)


async def add_to_workspace(
    client: GatewayClient, token: str, name: str, folder: str, fd: int
) -> Any:
    """AddToWorkspace with the pipe's read end passed as a unix fd."""
    return await client.call_with_fd_as(token, api.ADD_TO_WORKSPACE, fd, name, folder)
