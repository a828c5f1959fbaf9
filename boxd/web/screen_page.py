"""The owner's screen: the page's own files, served from the wheel as they are (no build step,
nothing fetched at run time).

The files are read once, when the gateway starts, from a fixed list: no path from a request ever
reaches the file system. Every answer forbids what the page does not need (other origins'
scripts, styles and connections; framing; sniffing), so text a task wrote that the page shows
can never become code, even if a bug put it into HTML.
"""

from dataclasses import dataclass
from importlib import resources

from aiohttp import web

from boxd.errors import Problem, die

SCREEN_PREFIX = "/screen/"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}
# data: images are the pairing QR codes, blob: ones a workspace's pictures the page fetched with
# its session (an <img> cannot send it); both shown as <img>, where even an SVG runs nothing.
_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": _POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # The page changes with every release of the wheel; a stale script against a new API
    # would misbehave quietly.
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class ScreenFile:
    body: bytes
    content_type: str


def _load() -> dict[str, ScreenFile]:
    found: dict[str, ScreenFile] = {}
    for entry in resources.files("boxd.web").joinpath("screen").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _TYPES:
            found[entry.name] = ScreenFile(entry.read_bytes(), _TYPES[suffix])
    if "index.html" not in found:
        raise RuntimeError("boxd's wheel lacks boxd/web/screen/index.html: reinstall boxd")
    return found


class ScreenPage:
    def __init__(self) -> None:
        self._files = _load()

    def _answer(self, name: str) -> web.Response:
        file = self._files.get(name)
        if file is None:
            die(Problem.NOT_FOUND, f"the screen has no file {name[:100]!r}")
        response = web.Response(body=file.body, headers=_HEADERS)
        response.headers["Content-Type"] = file.content_type
        return response

    async def index(self, request: web.Request) -> web.Response:
        return self._answer("index.html")

    async def file(self, request: web.Request) -> web.Response:
        return self._answer(request.match_info["name"])

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/", self.index)
        router.add_get(SCREEN_PREFIX + "{name}", self.file)
