"""The gateway's answers made of D-Bus pages (boxd/doors/json_pages.py), written with aiohttp."""

from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from boxd.doors.json_pages import pieces


async def stream(
    request: web.Request,
    pages: AsyncIterator[dict[str, Any]],
    key: str,
    head: Callable[[dict[str, Any]], dict[str, Any] | None],
    status: int = 200,
) -> web.StreamResponse:
    """Answers `{...head(first page), key: [every page's items]}`, or the bare list when head
    gives None, page by page (boxd/doors/json_pages.py)."""
    first = await anext(pages)
    response = web.StreamResponse(status=status)
    response.content_type = "application/json"
    await response.prepare(request)
    async for piece in pieces(first, pages, key, head):
        await response.write(piece)
    await response.write_eof()
    return response
