"""A model request as the gateway forwards it: read with bounded memory, checked against the
allowlists (boxd.broker.model.allowlist), the task's model spliced in, and the most its input can
cost, for the reservation made before it goes.

Memory. A request may be 32 MiB (Anthropic's own limit), and decoding one whole into Python
objects takes many times its size: a list of small numbers is an 8-byte pointer for every
2 bytes of JSON, an empty object 64 bytes for 2 (docs/performance.md, "A model request's
memory"). So:
- its bytes are checked to be UTF-8 a megabyte at a time, and then read as Latin-1, one
  character a byte whatever the text holds (UTF-8 would make one emoji anywhere in it take four
  bytes for every character of the whole text); every name the checks look for is ASCII, which
  Latin-1 reads as UTF-8 does;
- a body over a megabyte that holds more than MAX_VALUES JSON values outside its strings is
  refused before anything of it is decoded: no model's context takes that many (each value is a
  token at least), so only a request made to exhaust the gateway's memory has them;
- what goes upstream is the worker's own bytes, in slices around the model spliced in, never a
  second copy of them.

The worst case of its input: a token is at least a byte of text, and ordinary text is three to
four bytes a token, so the estimate is a token for every BYTES_PER_TOKEN bytes outside its
images (an image is billed by its pixels: IMAGE_TOKENS at most), capped at the model's context;
a request with a PDF in it (billed by its pages) is estimated at the whole context.
A request whose input is denser than that is charged what it really cost as soon as the reply's
`message_start` says so (boxd.broker.model.cost_reports).
"""

import codecs
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from boxd.broker.model.allowlist import (
    IMAGE_TOKENS,
    Refused,
    Shape,
    check_betas,
    check_fields,
    shown,
)

# Bodies up to this size are decoded whole without counting their values first: the most
# they can take decoded (an empty object a 3 bytes of JSON, 25 times that in Python) is what
# MAX_VALUES values take, and what the gateway can hold for one request at a time.
COUNT_VALUES_ABOVE = 4 * 1024 * 1024
# Each value is a token at least of a model's 200,000-token context, so this is half as much
# again as any request a model takes; what their objects take decoded: docs/performance.md,
# "A model request's memory".
MAX_VALUES = 300_000
_UTF8_CHUNK = 1024 * 1024
# The JSON strings of a body (their escapes included), to set them aside when counting values.
# A string left open runs to the end: without that, each escaped quote in an unclosed string
# would start the search again, a time that grows with the square of their number.
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\Z)')
_SPACE = re.compile(r"[ \t\n\r]*")
BYTES_PER_TOKEN = 3
# Every model the box prices takes 200,000 tokens of input at most (the 1M-token context is a
# beta the gateway does not pass).
CONTEXT_TOKENS = 200_000


class NotAnObject(ValueError):
    """JSON, but not an object: not a Messages API request."""


class TooDense(ValueError):
    """More JSON values than any model's context takes."""


def _no_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object, refused if it names a key twice: readers differ on which value counts, and the
    upstream must not read another request than the one checked here."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise Refused(f"the request names {shown(name)} twice in one object")
            seen.add(name)
    return found


_DECODER = json.JSONDecoder(object_pairs_hook=_no_twice)


@dataclass(frozen=True)
class ModelRequest:
    """A checked request: the bytes to send, in order, and what its reservation needs."""

    parts: tuple[memoryview, ...]
    length: int
    max_tokens: int
    stream: bool
    # The estimate of its input tokens, and whether any of them go to the 1-hour cache.
    input_tokens: int
    hour_cache: bool


def _skip(text: str, at: int) -> int:
    match = _SPACE.match(text, at)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _expect(text: str, at: int, what: str) -> int:
    """The position after `what`, which must be at `at`."""
    if text[at : at + 1] != what:
        raise ValueError(f"expected {what!r} at character {at}")
    return at + 1


def _check_utf8(body: memoryview) -> None:
    """UnicodeDecodeError (a ValueError) unless `body` is UTF-8; holds a megabyte at a time."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    for start in range(0, len(body), _UTF8_CHUNK):
        decoder.decode(body[start : start + _UTF8_CHUNK])
    decoder.decode(b"", final=True)


def _marks(text: bytes | bytearray) -> int:
    """Every value but the first follows a comma, or opens a list or an object."""
    return text.count(b",") + text.count(b"[") + text.count(b"{") + 1


def values_outside_strings(body: bytes | bytearray) -> int:
    """How many JSON values `body` holds at most, its strings set aside."""
    return _marks(_STRINGS.sub(b'""', body))


def count_values(body: bytes | bytearray) -> int:
    """How many JSON values `body` holds at most: the marks counted with its strings in are a
    bound found at once (a few milliseconds for 4 MB); the strings are set aside (ten times
    slower) only when that bound is past MAX_VALUES."""
    rough = _marks(body)
    return rough if rough <= MAX_VALUES else values_outside_strings(body)


def _top_level(text: str) -> tuple[dict[str, Any], list[tuple[int, int]], int]:
    """The object's fields, the spans of its `model` value, and where it opens."""
    start = _skip(text, 0)
    if text[start : start + 1] != "{":
        _DECODER.raw_decode(text, start)  # not JSON at all raises here
        raise NotAnObject("the request is not a JSON object")
    at = _skip(text, start + 1)
    fields: dict[str, Any] = {}
    spans: list[tuple[int, int]] = []
    if text[at : at + 1] == "}":
        at += 1
    else:
        while True:
            if text[at : at + 1] != '"':
                raise ValueError(f"expected a key at character {at}")
            key, at = _DECODER.raw_decode(text, at)
            at = _expect(text, _skip(text, at), ":")
            value_start = _skip(text, at)
            value, at = _DECODER.raw_decode(text, value_start)
            if key in fields:
                raise Refused(f"the request names {shown(key)} twice")
            fields[key] = value
            if key == "model":
                spans.append((value_start, at))
            at = _skip(text, at)
            if text[at : at + 1] == ",":
                at = _skip(text, at + 1)
                continue
            at = _expect(text, at, "}")
            break
    if _skip(text, at) != len(text):
        raise ValueError(f"extra data after the object at character {at}")
    return fields, spans, start


def read_request(body: bytes | bytearray, model: str, beta: str | None = None) -> ModelRequest:
    """The request in `body`, checked, with `model` as its model. Refused for what the gateway
    does not pass (its words name it), TooDense, NotAnObject, another ValueError if `body` is not
    JSON, RecursionError if it nests too deep to read."""
    check_betas(beta)
    view = memoryview(body)
    _check_utf8(view)
    if len(body) > COUNT_VALUES_ABOVE and count_values(body) > MAX_VALUES:
        raise TooDense(
            f"the request holds more than {MAX_VALUES:,} JSON values (numbers, lists, objects), "
            "more than any model's context takes"
        )
    fields, spans, start = _top_level(body.decode("latin-1"))
    shape = Shape()
    check_fields(fields, shape)
    max_tokens = _max_tokens(fields.get("max_tokens"))
    stream = fields.get("stream", False)
    if not isinstance(stream, bool):
        raise Refused("stream must be true or false")
    del fields
    ours = json.dumps(model).encode()
    if spans:
        ((begin, end),) = spans
        parts = (view[:begin], memoryview(ours), view[end:])
    else:
        # Not empty: max_tokens is there.
        parts = (view[: start + 1], memoryview(b'"model":' + ours + b","), view[start + 1 :])
    text_bytes = max(len(body) - shape.image_bytes, 0)
    tokens = math.ceil(text_bytes / BYTES_PER_TOKEN) + shape.images * IMAGE_TOKENS
    if shape.pdfs:
        # A PDF is billed by its pages, each as an image and its text (some 1,500 to 3,000
        # tokens a page), and a few kilobytes can hold a hundred pages: its worst case is the
        # whole context.
        tokens = CONTEXT_TOKENS
    return ModelRequest(
        parts=parts,
        length=sum(len(part) for part in parts),
        max_tokens=max_tokens,
        stream=stream,
        input_tokens=min(tokens, CONTEXT_TOKENS),
        hour_cache=shape.hour_cache,
    )


def _max_tokens(value: object) -> int:
    """The request's max_tokens; the manager holds it to the box's cap (Settings
    modelMaxTokens), which its reservation is made from."""
    if value is None:
        raise Refused("max_tokens is required: the most output tokens the reply may have")
    if type(value) is not int or value < 1:
        raise Refused(f"max_tokens must be a whole number of tokens, 1 or more, not {shown(value)}")
    return value
