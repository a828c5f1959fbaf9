"""An answer put together from the pages of a D-Bus answer (boxd.manager.pages), as the pieces
of JSON to write out one by one, so neither the gateway nor a broker holds a long answer whole.
The gateway writes them with aiohttp (boxd/web/json_stream.py), a broker with its own server."""

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from boxd.errors import BoxError


async def pieces(
    first: dict[str, Any],
    pages: AsyncIterator[dict[str, Any]],
    key: str,
    head: Callable[[dict[str, Any]], dict[str, Any] | None],
) -> AsyncIterator[bytes]:
    """`{...head(first page), key: [every page's items]}`, or the bare list when head gives
    None. The first page is asked for by the caller before the answer starts, so a refusal
    still gets its own status; a failure after that cuts the answer off (ConnectionResetError),
    which a client sees as broken."""
    fields = head(first)
    if fields is None:
        opening, closing = "[", "]"
    else:
        before = ", ".join(
            f"{json.dumps(name)}: {json.dumps(value)}" for name, value in fields.items()
        )
        opening = "{" + (before + ", " if before else "") + json.dumps(key) + ": ["
        closing = "]}"
    yield opening.encode()
    written = 0
    page: dict[str, Any] | None = first
    while page is not None:
        items = page.get(key, [])
        if items:
            text = ", ".join(json.dumps(item) for item in items)
            yield ((", " if written else "") + text).encode()
            written += len(items)
        try:
            page = await anext(pages, None)
        except BoxError as error:
            # The status is sent: all that is left is to cut the answer off.
            raise ConnectionResetError(f"the answer was cut off: {error.message}") from error
    yield closing.encode()
