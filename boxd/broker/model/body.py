"""A model request's body, read whole into one buffer with bounded memory, before it is checked
(boxd.broker.model.request) and sent upstream (boxd.broker.model.exchange)."""

import contextlib

from aiohttp import web

# A long Droid conversation is resent whole each turn: hundreds of thousands of tokens of text,
# tool results and images, base64. Anthropic's own limit for a Messages request is 32 MB.
MAX_REQUEST = 32 * 1024 * 1024
MAX_REQUEST_WORDS = "32 MiB"
# Bodies larger than this are checked in a thread, one at a time (checking takes memory in
# proportion to the body), and sent upstream in slices.
LARGE_BODY = 1024 * 1024

BODY = web.RequestKey(f"{__name__}.body", bytearray)


class TooLarge(Exception):
    pass


async def read_body(request: web.Request) -> bytearray:
    """The request's body, up to MAX_REQUEST, in one buffer: of the size the request says when
    it says one, so no copy of it is made (aiohttp's own read joins its chunks into a second
    one). Kept in the request: the connection guard reads it whole before the handler runs."""
    kept = request.get(BODY)
    if isinstance(kept, bytearray):
        return kept
    length = request.content_length
    if length is not None and length > MAX_REQUEST:
        raise TooLarge
    body = bytearray(length or 0)
    view = memoryview(body)
    got = 0
    async for chunk in request.content.iter_any():
        if got + len(chunk) > (MAX_REQUEST if length is None else length):
            raise TooLarge
        if length is None:
            view.release()
            body += chunk
            view = memoryview(body)
        else:
            view[got : got + len(chunk)] = chunk
        got += len(chunk)
    view.release()
    if length is not None and got != length:
        raise ConnectionResetError("the request's body ended before its length")
    request[BODY] = body
    return body


async def keep_body(request: web.Request) -> None:
    """read_body for the connection guard: a body over MAX_REQUEST is left for the handler to
    refuse in the API's words."""
    with contextlib.suppress(TooLarge):
        await read_body(request)
