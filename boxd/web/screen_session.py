"""The screen's session on the gateway: the cookie the login link gives, and the CSRF check on
every request that changes something and comes with that cookie.

Nothing is kept here. The CSRF token is derived from the session (a hash of it under a name of
its own), so the gateway checks it with no state, and only a page that can read what the login
set (a page of this origin) can send it; the manager alone decides whether the session is live.
"""

import hashlib
import hmac

from aiohttp import web

from boxd.caller import LINK_USED, SCREEN_SESSION_SECONDS
from boxd.dbus.client import GatewayClient
from boxd.errors import BoxError, Problem, die
from boxd.json_errors import Handler

# Where boxd-web listens (units/boxd-web.socket); `boxctl open` builds its link on it.
SCREEN_ADDRESS = "http://127.0.0.1:7700"
LOGIN_PATH = "/login"
SESSION_COOKIE = "boxd_screen"
# Readable by the page (not HttpOnly): it sends the value back as CSRF_HEADER.
CSRF_COOKIE = "boxd_csrf"
CSRF_HEADER = "X-CSRF-Token"
NO_TOKEN = "send Authorization: Bearer <token> (boxctl token create makes one)"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
NO_CSRF = (
    f"this request changes something and came with the screen's session cookie, so it needs "
    f"the header {CSRF_HEADER} with the value of the {CSRF_COOKIE} cookie"
)
OTHER_ORIGIN = "the screen's session only acts for pages of this box's own address ({origin})"
SESSION_ENDED = (
    f"this screen's session has ended (revoked, over {SCREEN_SESSION_SECONDS // 3600} hours "
    "after it began, or the box forgot it): "
    "run boxctl open for a new link"
)


def csrf_token(session: str) -> str:
    return hashlib.sha256(f"boxd csrf token\0{session}".encode()).hexdigest()


def has_bearer(request: web.Request) -> bool:
    return "Authorization" in request.headers


def session_of(request: web.Request) -> str | None:
    """The session cookie's value, when the request has no bearer token (which comes first)."""
    if has_bearer(request):
        return None
    return request.cookies.get(SESSION_COOKIE) or None


def _check_csrf(request: web.Request, session: str) -> None:
    own = f"{request.scheme}://{request.host}"
    origin = request.headers.get("Origin")
    if origin is not None and origin != own:
        die(Problem.FORBIDDEN, OTHER_ORIGIN.format(origin=own))
    # Another port of 127.0.0.1 is the same site, so SameSite alone would let it through.
    if request.headers.get("Sec-Fetch-Site", "same-origin") != "same-origin":
        die(Problem.FORBIDDEN, OTHER_ORIGIN.format(origin=own))
    sent = request.headers.get(CSRF_HEADER, "")
    if not hmac.compare_digest(sent.encode(), csrf_token(session).encode()):
        die(Problem.FORBIDDEN, NO_CSRF)


@web.middleware
async def screen_session(request: web.Request, handler: Handler) -> web.StreamResponse:
    session = session_of(request)
    # A stale cookie must not stand in the way of logging in again.
    if session is None or request.path == LOGIN_PATH:
        return await handler(request)
    if request.method not in _SAFE_METHODS:
        _check_csrf(request, session)
    try:
        return await handler(request)
    except BoxError as failure:
        if failure.problem == Problem.UNAUTHORIZED:
            die(Problem.UNAUTHORIZED, SESSION_ENDED)
        raise


async def open_session(client: GatewayClient, request: web.Request) -> web.Response:
    """`GET /login?code=...`: the link from `boxctl open`, exchanged once for a session."""
    code = request.query.get("code", "")
    if not code:
        die(Problem.UNAUTHORIZED, "this link has no code: run boxctl open for a new one")
    try:
        answer = await client.call_as(code, "OpenScreenSession")
    except BoxError as failure:
        # To the manager a spent link is no caller at all; to the person it is a used link.
        if failure.problem == Problem.UNAUTHORIZED:
            die(Problem.UNAUTHORIZED, LINK_USED)
        raise
    session = answer["session"]
    response = web.Response(status=303, headers={"Location": "/"})
    # The code is spent, but nothing of the link should travel on.
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Cache-Control"] = "no-store"
    lasts = SCREEN_SESSION_SECONDS
    response.set_cookie(
        SESSION_COOKIE, session, path="/", httponly=True, samesite="Strict", max_age=lasts
    )
    response.set_cookie(
        CSRF_COOKIE, csrf_token(session), path="/", samesite="Strict", max_age=lasts
    )
    return response
