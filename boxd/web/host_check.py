"""The gateway answers only to this computer's own names.

boxd-web listens on 127.0.0.1 alone, so a request that names another host got here through a
name that was made to point at 127.0.0.1: DNS rebinding, a web page of another site reaching
into the box through the owner's browser. The page could not send the screen's cookie or a
token, but it could still read what the gateway shows anyone; naming the host stops it at once.
Any port is fine: an owner who forwards the port (ssh -L) still names a loopback host.
"""

from aiohttp import web

from boxd.errors import Problem, die
from boxd.json_errors import Handler

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})
NOT_THIS_BOX = (
    "this box answers only to its own names (127.0.0.1, localhost or [::1]) in the Host "
    "header; this request named {host}: open the address boxctl open gives"
)


def host_name(host: str) -> str:
    """The name in a Host header, without its port: `[::1]:7700` → `[::1]`."""
    if host.startswith("["):
        closing = host.find("]")
        return host[: closing + 1] if closing > 0 else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback_host(host: str | None) -> bool:
    if not host:
        return False
    return host_name(host.strip()).lower().rstrip(".") in LOOPBACK_NAMES


@web.middleware
async def only_own_names(request: web.Request, handler: Handler) -> web.StreamResponse:
    host = request.headers.get("Host")
    if not is_loopback_host(host):
        shown = repr(host[:100]) if host else "no host"
        die(Problem.FORBIDDEN, NOT_THIS_BOX.format(host=shown))
    return await handler(request)
