"""The screen's session on the gateway: `POST /api/session` trades the one-time code of
`boxctl open`'s link for a session, `DELETE /api/session` ends it.

No cookie carries it. Cookies are scoped to a host, not a port (RFC 6265 §8.5): what a browser
keeps for 127.0.0.1 goes with every request to any port of it, and a page there reads what is
not HttpOnly, so any local user who gets one page of theirs loaded would hold the screen. The
link carries the code after `#`, which the browser never sends (no server, log or Referer sees
it); the page takes it out of the address bar, trades it here, keeps the session in
sessionStorage (its own origin's alone) and sends it as `Authorization: Bearer`, as any token
is sent. The browser adds no credential to any request by itself, so no other page can make one
that acts for the owner, and there is no CSRF token to check. Nothing is kept here: the manager
alone decides whether the session is live.
"""

from typing import Annotated

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from boxd.dbus import interface as api
from boxd.dbus.client import GatewayClient
from boxd.doors.json_errors import Handler
from boxd.errors import BoxError, Problem, die
from boxd.wire.caller import LINK_USED, SCREEN_SESSION_PREFIX, SCREEN_SESSION_SECONDS
from boxd.wire.models.plain_errors import parse

SESSION_PATH = "/api/session"
NO_TOKEN = "send Authorization: Bearer <token> (boxctl token create makes one)"
SESSION_ENDED = (
    f"this screen's session has ended (revoked, over {SCREEN_SESSION_SECONDS // 3600} hours "
    "after it began, or the box forgot it): "
    "run boxctl open for a new link"
)


# The body of `POST /api/session` (no docstring: it would be the schema's description, which
# python -OO, as the units run, would leave out of the API's document).
class SessionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    code: Annotated[
        StrictStr, Field(max_length=100, description="The code after #login= in boxctl open's link")
    ]


def bearer(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def token_of(request: web.Request) -> str:
    """The caller's token (a screen's session is one): a header, never a cookie."""
    token = bearer(request)
    if token is None:
        die(Problem.UNAUTHORIZED, NO_TOKEN)
    return token


def is_screen_session(request: web.Request) -> bool:
    return (bearer(request) or "").startswith(SCREEN_SESSION_PREFIX)


@web.middleware
async def screen_session(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A screen's session the box refuses is told how to log in again, not how to make a token."""
    try:
        return await handler(request)
    except BoxError as failure:
        if failure.problem == Problem.UNAUTHORIZED and is_screen_session(request):
            die(Problem.UNAUTHORIZED, SESSION_ENDED)
        raise


async def open_session(client: GatewayClient, request: web.Request) -> web.Response:
    """`POST /api/session {"code"}`: the link's code, exchanged once for a session."""
    code = parse(SessionRequest, await request.read()).code
    if not code:
        die(Problem.UNAUTHORIZED, LINK_USED)
    try:
        answer = await client.call_as(code, api.OPEN_SCREEN_SESSION)
    except BoxError as failure:
        # To the manager a spent link is no caller at all; to the person it is a used link.
        if failure.problem == Problem.UNAUTHORIZED:
            die(Problem.UNAUTHORIZED, LINK_USED)
        raise
    session = {"session": answer["session"], "expiresInSeconds": SCREEN_SESSION_SECONDS}
    return web.json_response(session, status=201, headers={"Cache-Control": "no-store"})


async def close_session(client: GatewayClient, request: web.Request) -> web.Response:
    """`DELETE /api/session`: the caller's own session ends (logging out)."""
    session = token_of(request)
    return web.json_response(await client.call_as(session, api.CLOSE_SCREEN_SESSION, session))
