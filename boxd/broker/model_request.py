"""A model request with the task's model put in: the top-level `model` value replaced and every
other byte as the worker sent it.

Spliced rather than parsed and written out again: a long Droid conversation is megabytes of JSON
sent every turn, and writing it out again cost more than reading it. Every top-level value is
still read in full (so what is forwarded is a JSON object, whatever the worker sent), and a
`model` key named twice has both values replaced, so no reader upstream can pick another.
"""

import json
import re

_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class NotAnObject(ValueError):
    """JSON, but not an object: not a Messages API request."""


def _skip(text: str, at: int) -> int:
    match = _SPACE.match(text, at)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _expect(text: str, at: int, what: str) -> int:
    """The position after `what`, which must be at `at`."""
    if text[at : at + 1] != what:
        raise ValueError(f"expected {what!r} at character {at}")
    return at + 1


def with_model(body: bytes, model: str) -> bytes:
    """The request in `body` with `model` as its model. ValueError if `body` is not JSON
    (NotAnObject if it is JSON but no object); RecursionError if it nests too deep to read."""
    text = body.decode("utf-8")
    start = _skip(text, 0)
    if text[start : start + 1] != "{":
        _DECODER.raw_decode(text, start)  # not JSON at all raises here
        raise NotAnObject("the request is not a JSON object")
    at = _skip(text, start + 1)
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
            _, at = _DECODER.raw_decode(text, value_start)
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
    ours = json.dumps(model)
    if not spans:
        empty = text[_skip(text, start + 1)] == "}"
        joint = "" if empty else ","
        return (text[: start + 1] + f'"model":{ours}{joint}' + text[start + 1 :]).encode()
    parts = []
    last = 0
    for begin, end in spans:
        parts += [text[last:begin], ours]
        last = end
    parts.append(text[last:])
    return "".join(parts).encode()
