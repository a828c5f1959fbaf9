"""The aiohttp middleware both HTTP servers share: every error is JSON `{"error": "..."}` in
plain words, with the status the server gives its problem codes."""

from collections.abc import Awaitable, Callable

from aiohttp import http_exceptions, web
from aiohttp.web_protocol import RequestPayloadError

from boxd.doors import http_refusals
from boxd.errors import BoxError
from boxd.reading.strict_json import MAX_BODY, TOO_LARGE

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
__all__ = ["MAX_BODY", "error", "json_errors"]


def error(message: str, status: int) -> web.Response:
    return web.json_response({"error": message}, status=status)


def json_errors(
    status_of: Callable[[BoxError], int], routes: str
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """`routes` tells a caller who asked for something unknown what there is. What aiohttp's
    parser refuses before any middleware is answered in the same shape
    (boxd/doors/http_refusals.py)."""
    http_refusals.install()

    async def answer(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except BoxError as failure:
            return error(failure.message, status_of(failure))
        except web.HTTPRequestEntityTooLarge:
            return error(TOO_LARGE, 413)
        except (http_exceptions.HttpProcessingError, RequestPayloadError) as failure:
            # Raised while reading the body: a Content-Encoding it is not in, a body cut short.
            return error(http_refusals.words(400, failure.__cause__ or failure), 400)
        except web.HTTPNotFound:
            return error(f"no such request: {request.method} {request.path}; {routes}", 404)
        except web.HTTPMethodNotAllowed:
            return error(f"{request.path} does not take {request.method}", 405)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await answer(request, handler)
        if not request.content.is_eof():
            # A body left unread (refused before it was read, a route that reads none, one
            # that failed to read): aiohttp would read it after the answer and log one it
            # cannot decompress as an unhandled exception. Its end is marked instead, and the
            # connection, which cannot carry another request now, closes after the answer.
            request.content.feed_eof()
            response.force_close()
        return response

    return middleware
