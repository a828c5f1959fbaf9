"""The gateway answers only to this computer's own names, and to pages of its own address.

boxd-web listens on 127.0.0.1 alone, so a request that names another host got here through a
name that was made to point at 127.0.0.1: DNS rebinding, a web page of another site reaching
into the box through the owner's browser. The page could not send the screen's session or a
token, but it could still read what the gateway shows anyone; naming the host stops it at once.
Any port is fine: an owner who forwards the port (ssh -L) still names a loopback host.

A browser names in `Origin` the page a script's or a form's request comes from (save a GET or
HEAD of the page's own origin); one from another origin, another port of 127.0.0.1 included, is
refused before anything is asked. No credential of the box's travels by itself
(boxd.web.screen_session), so this is a second lock: such a page cannot trade a login link or a
pairing code through the owner's browser. Clients that are not browsers send no `Origin`.
"""

import re

from aiohttp import web

from boxd.doors.json_errors import Handler
from boxd.errors import Problem, die

# The whole header, strictly: one of the names, then at most a port of digits. A zone id
# (`[::1%25lo]`), anything after the bracket (`[::1]x`) or a port that is not a number is not
# a name of this box, whatever it begins with.
_OWN_HOST = re.compile(r"(?:127\.0\.0\.1|localhost\.?|\[::1\])(?::[0-9]{1,5})?", re.IGNORECASE)
NOT_THIS_BOX = (
    "this box answers only to its own names (127.0.0.1, localhost or [::1]) in the Host "
    "header; this request named {host}: open the address boxctl open gives"
)


OTHER_ORIGIN = (
    "this box answers only pages of its own address ({own}); this request came from a page "
    "of {origin}"
)


def is_loopback_host(host: str | None) -> bool:
    return host is not None and _OWN_HOST.fullmatch(host.strip()) is not None


@web.middleware
async def only_own_names(request: web.Request, handler: Handler) -> web.StreamResponse:
    # A second Host header never gets here: aiohttp's parser refuses it (a 400 in words,
    # boxd.doors.http_refusals), as tests/web/test_host_check.py shows.
    host = request.headers.get("Host")
    if not is_loopback_host(host):
        shown = repr(host[:100]) if host else "no host"
        die(Problem.FORBIDDEN, NOT_THIS_BOX.format(host=shown))
    origin = request.headers.get("Origin")
    own = f"{request.scheme}://{host}"
    if origin is not None and origin != own:
        die(Problem.FORBIDDEN, OTHER_ORIGIN.format(own=own, origin=repr(origin[:100])))
    return await handler(request)
