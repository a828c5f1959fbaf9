"""Reading HTTP/1.1 requests off a task's broker socket, one at a time, from the bytes as they
come (no I/O here: boxd/broker/http_server.py feeds it).

The broker serves its own task only, with small JSON bodies, so this reads exactly what its
clients send (the workers' unix_http, curl, aiohttp's client) and refuses the rest in words
that say what to change: a line over LONGEST_LINE bytes, a head over LONGEST_HEAD, a header
that is not `Name: value`, Content-Length and Transfer-Encoding together (the two readers in
front of a server that disagree on which wins is how requests are smuggled), a Content-Length
or a Host given twice, a chunked body that is not, a body over MAX_BODY, a Content-Encoding.
"""

import re
from dataclasses import dataclass
from urllib.parse import unquote

from boxd.reading.decimal_text import decimal
from boxd.reading.strict_json import MAX_BODY, TOO_LARGE

# aiohttp's own, which the broker's clients were written against.
LONGEST_LINE = 8190
LONGEST_HEAD = 64 * 1024
MOST_HEADERS = 100
_METHOD = re.compile(rb"[A-Z]{1,20}")
_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,100}")
_VERSION = re.compile(rb"HTTP/1\.([01])")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,8}")
# What a header's value may not hold: control bytes but the tab (a bare CR above all).
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# Headers a request may give once: two of them are read differently by different readers.
_ONCE = frozenset({"content-length", "transfer-encoding", "host", "content-encoding", "expect"})


class Refusal(Exception):
    """A request that cannot be read: answered `status` with `words`, then the connection
    closes, as what follows it on the connection cannot be told apart from it."""

    def __init__(self, status: int, words: str) -> None:
        super().__init__(words)
        self.status = status
        self.words = words


LINE_TOO_LONG = Refusal(
    400,
    f"the request's address or one of its headers is over {LONGEST_LINE} bytes: send a shorter one",
)


@dataclass(frozen=True)
class Head:
    method: str
    # The path, percent-decoded, without its query.
    path: str
    # What follows the path's "?", as sent.
    query: str
    headers: dict[str, str]
    # HTTP/1.1, which reads an answer in chunks; HTTP/1.0 does not.
    http11: bool
    keep_alive: bool
    # Whether the client waits for "100 Continue" before it sends the body.
    expects_continue: bool
    # The body's length, or None for a chunked body.
    length: int | None


@dataclass(frozen=True)
class Request:
    head: Head
    body: bytes

    @property
    def method(self) -> str:
        return self.head.method

    @property
    def path(self) -> str:
        return self.head.path


def _line_refusal(length: int) -> None:
    if length > LONGEST_LINE:
        raise LINE_TOO_LONG


def read_head(raw: bytes) -> Head:
    """The head of a request, its lines without their ends (CRLF, or a bare LF)."""
    lines = [line.removesuffix(b"\r") for line in raw.split(b"\n")]
    for line in lines:
        _line_refusal(len(line))
    start, fields = lines[0], lines[1:]
    parts = start.split(b" ")
    if len(parts) != 3 or not _METHOD.fullmatch(parts[0]):
        raise Refusal(400, "the request does not start with an HTTP method such as GET or POST")
    version = _VERSION.fullmatch(parts[2])
    if version is None:
        raise Refusal(400, "the request is not HTTP/1.1 this server can read")
    target = parts[1]
    if not target.startswith(b"/") or any(byte <= 0x20 or byte >= 0x7F for byte in target):
        raise Refusal(
            400, "the request's address cannot be read: percent-encode what is not plain text"
        )
    if len(fields) > MOST_HEADERS:
        raise Refusal(431, "the request has too many headers, or headers too long")
    headers: dict[str, str] = {}
    for field in fields:
        name, colon, value = field.partition(b":")
        if not colon or not _NAME.fullmatch(name) or _CONTROL.search(value):
            raise Refusal(
                400, "a header of the request cannot be read: send each header as Name: value"
            )
        key = name.decode("ascii").lower()
        text = value.strip(b" \t").decode("latin-1")
        if key in headers:
            if key in _ONCE:
                raise Refusal(
                    400,
                    f"the request sends its {name.decode('ascii')} header more than once: "
                    "send it once",
                )
            headers[key] += ", " + text
        else:
            headers[key] = text
    return _head(parts[0].decode("ascii"), target, headers, version[1] == b"1")


def _head(method: str, target: bytes, headers: dict[str, str], http11: bool) -> Head:
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise Refusal(
            400, "the broker reads bodies as they are: send this one without Content-Encoding"
        )
    chunked = "transfer-encoding" in headers
    if chunked and "content-length" in headers:
        raise Refusal(
            400,
            "the request gives both Content-Length and Transfer-Encoding: send one of them",
        )
    if chunked and headers["transfer-encoding"].strip().lower() != "chunked":
        raise Refusal(
            400,
            "the only Transfer-Encoding the broker reads is chunked: send the body with "
            "a Content-Length",
        )
    length: int | None = 0
    if chunked:
        length = None
    elif "content-length" in headers:
        given = headers["content-length"]
        length = decimal(given, most_digits=12)
        if length is None:
            raise Refusal(400, "the request's Content-Length is not a number of bytes")
        if length > MAX_BODY:
            raise Refusal(413, TOO_LARGE)
    connection = {word.strip() for word in headers.get("connection", "").lower().split(",")}
    # HTTP/1.0 is answered and closed: its keep-alive needs the answer to say so, and no
    # client of the broker's speaks it.
    keep_alive = http11 and "close" not in connection
    expects = headers.get("expect", "").strip().lower()
    if expects not in ("", "100-continue"):
        raise Refusal(417, f"the broker cannot meet the Expect header {expects[:40]!r}")
    path, _, query = target.decode("ascii").partition("?")
    return Head(
        method,
        unquote(path, errors="replace"),
        query,
        headers,
        http11,
        keep_alive,
        expects == "100-continue" and http11,
        length,
    )


class RequestReader:
    """Takes a connection's bytes as they come and gives its requests, one at a time."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.head: Head | None = None
        self._body = bytearray()
        # A chunked body: the bytes of the chunk in hand still to come (then its CRLF), or None
        # while a size line is awaited; and whether the last chunk came (trailers follow).
        self._chunk_left: int | None = None
        self._trailers = False
        # How much of the buffer was searched for the end of a head: a head trickled in a byte
        # at a time is searched once in all, not once per byte (which made it quadratic).
        self._searched = 0

    @property
    def between_requests(self) -> bool:
        """Nothing of a next request heard."""
        return self.head is None and not self.buffer

    def feed(self, data: bytes | memoryview) -> None:
        self.buffer += data

    def next(self) -> Head | Request | None:
        """A head as soon as it is whole (the body may follow), then the whole request; None
        while more bytes are needed. Raises Refusal for what cannot be read."""
        if self.head is None:
            head = self._read_head()
            if head is None:
                return None
            self.head = head
            return head
        body = self._read_body(self.head)
        if body is None:
            return None
        request = Request(self.head, body)
        self.head = None
        self._body = bytearray()
        return request

    def _read_head(self) -> Head | None:
        buffer = self.buffer
        # Blank lines before a request are skipped (RFC 9112 2.2: a client may send a CRLF
        # after a body).
        while buffer[:2] == b"\r\n" or buffer[:1] == b"\n":
            del buffer[: 2 if buffer[:1] == b"\r" else 1]
            self._searched = 0
        # A blank line may straddle what was searched and what came since.
        end = _head_end(buffer, max(0, self._searched - 3))
        if end is None:
            self._searched = len(buffer)
            last_line = len(buffer) - (buffer.rfind(b"\n") + 1)
            _line_refusal(last_line)
            if len(buffer) > LONGEST_HEAD:
                raise Refusal(431, "the request has too many headers, or headers too long")
            return None
        head_end, body_start = end
        if head_end > LONGEST_HEAD:
            raise Refusal(431, "the request has too many headers, or headers too long")
        head = read_head(bytes(buffer[:head_end]))
        del buffer[:body_start]
        self._searched = 0
        return head

    def _read_body(self, head: Head) -> bytes | None:
        buffer = self.buffer
        if head.length is not None:
            if len(buffer) < head.length:
                return None
            body = bytes(buffer[: head.length])
            del buffer[: head.length]
            return body
        while True:
            if self._trailers:
                end = _head_end(b"\r\n" + buffer)
                if end is None:
                    _line_refusal(len(buffer))
                    return None
                del buffer[: end[1] - 2]
                self._trailers = False
                self._chunk_left = None
                return bytes(self._body)
            if self._chunk_left is None:
                line_end = buffer.find(b"\n")
                if line_end < 0:
                    _line_refusal(len(buffer))
                    return None
                size = bytes(buffer[:line_end]).removesuffix(b"\r").partition(b";")[0].strip()
                del buffer[: line_end + 1]
                if not _HEX.fullmatch(size):
                    raise Refusal(
                        400, "the body's chunks cannot be read: send it with a Content-Length"
                    )
                self._chunk_left = int(size, 16)
                if len(self._body) + self._chunk_left > MAX_BODY:
                    raise Refusal(413, TOO_LARGE)
                if self._chunk_left == 0:
                    self._trailers = True
                continue
            wanted = self._chunk_left
            if len(buffer) < wanted + 2:
                # The chunk's bytes are taken as they come: a large one is not kept twice.
                taken = min(len(buffer), wanted)
                self._body += buffer[:taken]
                del buffer[:taken]
                self._chunk_left -= taken
                return None
            self._body += buffer[:wanted]
            ending = bytes(buffer[wanted : wanted + 2])
            if ending != b"\r\n":
                raise Refusal(
                    400, "the body's chunks cannot be read: send it with a Content-Length"
                )
            del buffer[: wanted + 2]
            self._chunk_left = None


def _head_end(buffer: bytes | bytearray, start: int = 0) -> tuple[int, int] | None:
    """Where a head ends (the end of its last line) and its body starts, or None; searched
    from `start`."""
    found = [
        (at, at + len(blank))
        for blank in (b"\r\n\r\n", b"\n\n", b"\n\r\n")
        if (at := buffer.find(blank, start)) >= 0
    ]
    return min(found) if found else None
