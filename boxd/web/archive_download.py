"""GET /api/workspaces/{name}/archive[/{path}]: a folder of the workspace as it stands, or all of
it, as a tar sent as the manager makes it (OpenWorkspaceArchive answers with a pipe's read end).

The pipe is read by the event loop (connect_read_pipe, its reader paused while the client is
slow to take what was read, aiohttp's write waiting for the socket), so the archive is never held
here either: the manager's thread waits on a full pipe, this process on a full socket. A client
that goes away closes the pipe, and the manager's thread ends on EPIPE.

The length is not known before the end: the answer is chunked. A manager that failed half way
ends the pipe early and the tar is cut short of its end blocks, which tar reports as an
unexpected end of the archive.
"""

import asyncio
import os

from aiohttp import web

from boxd.dbus import interface as api
from boxd.dbus.client import GatewayClient
from boxd.web.screen_session import token_of

# What one read of the pipe hands to the socket; the reader pauses at twice this unsent.
CHUNK = 1 << 20


async def download_archive(request: web.Request, client: GatewayClient) -> web.StreamResponse:
    name = request.match_info["name"]
    path = request.match_info.get("path", "")
    token = token_of(request)
    answer, fd = await client.call_for_fd_as(token, api.OPEN_WORKSPACE_ARCHIVE, name, path)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=CHUNK, loop=loop)
    try:
        pipe = os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe
        )
    except BaseException:
        pipe.close()
        raise
    try:
        response = web.StreamResponse(
            headers={
                "Content-Type": "application/x-tar",
                # archive_name keeps to [A-Za-z0-9._-]: nothing in it can end the header's value.
                "Content-Disposition": f'attachment; filename="{answer["filename"]}"',
                "X-Content-Type-Options": "nosniff",
                "Cache-Control": "no-store",
            }
        )
        await response.prepare(request)
        while chunk := await reader.read(CHUNK):
            await response.write(chunk)
        await response.write_eof()
        return response
    finally:
        transport.close()
