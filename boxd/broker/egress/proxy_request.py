"""The head of a request to the HTTP proxy, read and checked: `CONNECT host:port` or an
absolute-form request such as `GET http://example.com/path HTTP/1.1`.

Only the head is read here; a body streams through untouched, framed however the client framed
it. The head is capped, so a task cannot make the broker hold an endless header in memory.
"""

import asyncio
import re
from dataclasses import dataclass

from boxd.broker.egress.socket_reader import SocketReader
from boxd.doors.connection_limits import HEAD_SECONDS
from boxd.net.egress_target import BadTarget, Target, parse_authority

MAX_HEAD = 64 * 1024
_METHOD = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_FIELD = re.compile(r"([A-Za-z0-9!#$%&'*+.^_`|~-]+):[ \t]*(.*?)[ \t]*")
# Hop-by-hop: they describe the task's connection to the proxy, not the request. Proxy-* carry
# what the task says to the proxy, which the origin has no business reading.
_HOP_BY_HOP = {
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "host",
}
USAGE = (
    "this is the task's egress proxy: send CONNECT host:port, or a request with a full "
    "http:// URL, like GET http://example.com/ HTTP/1.1"
)


class BadRequest(Exception):
    """The request cannot be served; `status` is the HTTP status, the message says why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ProxyRequest:
    method: str
    target: Target
    # For plain HTTP: the path and query to send the origin, and the version the task spoke.
    path: str
    version: str
    authority: str
    headers: list[tuple[str, str]]

    @property
    def connect(self) -> bool:
        return self.method == "CONNECT"

    def forward_head(self) -> bytes:
        """The head to send the origin: origin-form, hop-by-hop headers out, one request
        per connection (the proxy does not read answers, so it cannot reuse one)."""
        named = {
            token.strip().lower()
            for name, value in self.headers
            if name.lower() in ("connection", "proxy-connection")
            for token in value.split(",")
        }
        lines = [f"{self.method} {self.path} {self.version}", f"Host: {self.authority}"]
        for name, value in self.headers:
            if name.lower() not in _HOP_BY_HOP and name.lower() not in named:
                lines.append(f"{name}: {value}")
        lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def read_head(reader: SocketReader) -> list[str]:
    """The request line and header lines, without line ends; BadRequest past MAX_HEAD. What
    follows the head stays in the reader."""
    lines: list[str] = []
    size = 0
    start = 0  # where the line being read begins in the reader's buffer
    async with asyncio.timeout(HEAD_SECONDS):
        while True:
            end = reader.buffer.find(b"\n", start)
            if end == -1:
                if size + len(reader.buffer) - start > MAX_HEAD:
                    raise BadRequest(f"the request head is over {MAX_HEAD // 1024} KiB", 431)
                if await reader.more():
                    continue
                if not lines and start == len(reader.buffer):
                    # Nothing was asked (a port probe, a client that gave up): nothing to answer.
                    raise ConnectionAbortedError("the task closed before sending a request")
                raise BadRequest("the connection closed in the middle of the request")
            line = reader.buffer[start : end + 1]
            start = end + 1
            size += len(line)
            if size > MAX_HEAD:
                raise BadRequest(f"the request head is over {MAX_HEAD // 1024} KiB", 431)
            text = line.decode("latin-1").rstrip("\r\n")
            # A stray CR or NUL would let one line pass for two on the origin's side.
            if _CONTROL.search(text):
                raise BadRequest("the request head has control characters in it")
            if not text:
                if lines:
                    del reader.buffer[:start]
                    return lines
                continue  # RFC 9112 lets a server ignore empty lines before a request
            lines.append(text)


def _headers(lines: list[str]) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    for line in lines:
        match = _FIELD.fullmatch(line)
        if match is None:
            raise BadRequest(f"the header line {line[:100]!r} is not a header")
        headers.append((match[1], match[2]))
    return headers


def _split_url(url: str) -> tuple[str, str]:
    """(authority, path and query) of an http:// URL."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "http":
        if scheme.lower() == "https":
            raise BadRequest(f"{url[:200]!r} is https: send CONNECT host:443 and speak TLS")
        if url.startswith("/"):
            raise BadRequest(f"{url[:200]!r} is a path alone; {USAGE}")
        raise BadRequest(f"{url[:200]!r} is not an http:// URL; {USAGE}")
    end = len(rest)
    for mark in "/?#":
        found = rest.find(mark)
        if found != -1:
            end = min(end, found)
    authority, path = rest[:end], rest[end:].partition("#")[0]
    if "@" in authority:
        raise BadRequest("a user name or password in the URL is not passed on; send it in a header")
    if not path.startswith("/"):
        path = "/" + path
    return authority, path


def parse_request(lines: list[str]) -> ProxyRequest:
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _METHOD.fullmatch(parts[0]):
        raise BadRequest(f"{lines[0][:200]!r} is not an HTTP request line; {USAGE}")
    method, url, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest(f"{version[:20]!r} is not HTTP/1.1 or HTTP/1.0", 505)
    headers = _headers(lines[1:])
    try:
        if method == "CONNECT":
            return ProxyRequest(method, parse_authority(url), "", version, url, headers)
        authority, path = _split_url(url)
        target = parse_authority(authority, default_port=80)
    except BadTarget as error:
        raise BadRequest(str(error)) from None
    return ProxyRequest(method, target, path, version, authority, headers)
