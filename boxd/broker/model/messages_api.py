"""Anthropic's Messages API as the model gateway speaks it to the worker: its one route, the error
shape Droid reads, and the status Droid retries. Every refusal of the gateway is in this shape,
in plain words."""

from collections.abc import Awaitable, Callable

from aiohttp import web

from boxd.broker.model.body import MAX_REQUEST_WORDS
from boxd.errors import BoxError, Problem

MESSAGES = "/v1/messages"
# The status Droid 0.225.2 retries, with its own backoff (about 5 s, 14 s, then every 33 s,
# nine times over some four minutes, before it gives up), as it does 500, 503 and 429. A 401
# or 403 it does not retry: the `droid exec` fails at once.
RETRY_LATER = 529

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}

_STATUS_OF = {
    Problem.INVALID: 400,
    Problem.UNAUTHORIZED: 401,
    Problem.FORBIDDEN: 403,
    Problem.NOT_FOUND: 404,
    Problem.TOO_LARGE: 413,
    # The manager away (boxd restarting): Droid tries again.
    Problem.UNAVAILABLE: RETRY_LATER,
    # The box's disk is full: nothing was logged; Droid tries again, by when there may be room.
    Problem.FULL: RETRY_LATER,
}


def api_error(status: int, message: str, *, retry: bool | None = None) -> web.Response:
    """An error in the shape Anthropic's API (and so Droid) reads, in plain words."""
    kind = _ERROR_TYPES.get(status, "api_error")
    headers = {} if retry is None else {"x-should-retry": "true" if retry else "false"}
    return web.json_response(
        {"type": "error", "error": {"type": kind, "message": message}},
        status=status,
        headers=headers,
    )


def api_error_words(message: str, status: int) -> web.Response:
    """api_error as the connection guard calls it, for what it answers itself (408, 503)."""
    return api_error(status, message)


def too_large() -> web.Response:
    return api_error(
        413, f"the request body is over {MAX_REQUEST_WORDS}, more than the model gateway takes"
    )


@web.middleware
async def api_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """A BoxError, and aiohttp's own refusals, answered in the API's shape."""
    try:
        return await handler(request)
    except BoxError as failure:
        return api_error(_STATUS_OF.get(failure.problem, 500), failure.message)
    except web.HTTPRequestEntityTooLarge:
        return too_large()
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
        return api_error(
            404,
            f"the model gateway serves POST {MESSAGES} (Anthropic's Messages API) only, "
            f"not {request.method} {request.path}",
        )
