"""An HTTP answer put together from the pages of a D-Bus answer (boxd.manager.pages), written
out page by page, so neither the gateway nor a broker holds a long answer whole."""

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from boxd.errors import BoxError


async def stream(
    request: web.Request,
    pages: AsyncIterator[dict[str, Any]],
    key: str,
    head: Callable[[dict[str, Any]], dict[str, Any] | None],
    status: int = 200,
) -> web.StreamResponse:
    """Answers `{...head(first page), key: [every page's items]}`, or the bare list when head
    gives None. The first page is asked for before the answer starts, so a refusal still gets
    its own status; a failure after that cuts the answer off, which a client sees as broken."""
    first = await anext(pages)
    fields = head(first)
    response = web.StreamResponse(status=status)
    response.content_type = "application/json"
    await response.prepare(request)
    if fields is None:
        opening, closing = "[", "]"
    else:
        before = ", ".join(
            f"{json.dumps(name)}: {json.dumps(value)}" for name, value in fields.items()
        )
        opening = "{" + (before + ", " if before else "") + json.dumps(key) + ": ["
        closing = "]}"
    await response.write(opening.encode())
    written = 0
    page: dict[str, Any] | None = first
    while page is not None:
        items = page.get(key, [])
        if items:
            text = ", ".join(json.dumps(item) for item in items)
            await response.write(((", " if written else "") + text).encode())
            written += len(items)
        try:
            page = await anext(pages, None)
        except BoxError as error:
            # The status is sent: all that is left is to cut the answer off.
            raise ConnectionResetError(f"the answer was cut off: {error.message}") from error
    await response.write(closing.encode())
    await response.write_eof()
    return response
