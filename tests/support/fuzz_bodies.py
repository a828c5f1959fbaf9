"""Garbage for the fuzz tests: bodies built from a model's JSON Schema, then broken, path
segments no caller should send, and the property every answer must have.

A body is drawn as a value (from the schema, so it is often valid and reaches deep into a route)
and then broken the ways an attacker would: a field of the wrong type, a number at JSON's edges,
a key given twice, an unknown field, values huge or nested 100,000 deep, bytes that are not
UTF-8, a body cut short or empty, and a Content-Type that is not JSON. Huge values are made only
when drawn, so an example costs what it sends. Hypothesis shrinks a failure to its smallest body
and the tests run derandomized, so a failure replays as it was printed.
"""

import gzip
import json
import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any
from urllib.parse import quote

import aiohttp
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from yarl import URL

from boxd.web.event_stream import EVENTS_PATH
from boxd.web.openapi import ROUTES
from tests.support.old_request_models import (
    AskRequest,
    CallRequest,
    CostRequest,
    Step,
    UsageRequest,
)

MB = 1024 * 1024

# Bounded in time, the same every run (derandomize): a failure replays from its printed example.
# The server is one per test, shared by its examples on purpose (it must outlive them), and a
# 10 MB body is slow and large by design: those health checks would only make the run flaky.
# Examples per test: few enough for `make unit`; BOXD_FUZZ_EXAMPLES=2000 for a long run.
EXAMPLES = int(os.environ.get("BOXD_FUZZ_EXAMPLES", "20"))
# The explain phase replays a failure hundreds of times to annotate it: minutes, for a line.
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    derandomize=True,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


class Raw(str):
    """JSON text written into a body as it is: numbers and strings json.dumps would not write."""


@dataclass(frozen=True)
class Pairs:
    """A JSON object written pair by pair, so one key may come twice."""

    pairs: tuple[tuple[str, Any], ...]


def dump(value: Any) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Pairs):
        return "{" + ",".join(f"{json.dumps(k)}:{dump(v)}" for k, v in value.pairs) + "}"
    if isinstance(value, dict):
        return dump(Pairs(tuple(value.items())))
    if isinstance(value, list):
        return "[" + ",".join(dump(item) for item in value) + "]"
    return json.dumps(value)


# Numbers at JSON's edges, as text: past 2**53, negative zero, the largest doubles and past
# them, the constants Python reads and JSON has not, and integers far too long.
EDGE_NUMBERS = (
    "9007199254740991",
    "9007199254740992",
    "-9007199254740993",
    "-0",
    "-0.0",
    "0e0",
    "1e308",
    "1.7976931348623157e308",
    "1e309",
    "-1e309",
    "5e-324",
    "1e-400",
    "NaN",
    "Infinity",
    "-Infinity",
    "1" + "0" * 5000,
    "123456789012345678901234567890.5",
    "1E+2",
)
# Strings with what a D-Bus string, a terminal or a file name cannot hold.
EDGE_STRINGS = (
    '"\\u0000"',
    '"a\\u0000b"',
    '"\\ud800"',
    '"\\udfff\\ud800"',
    '"\\u001b[2J"',
    '"../../etc/passwd"',
    '"%00"',
    '"\\u202e"',
    '""',
    '"    "',
)


def _deep_list(depth: int) -> Raw:
    return Raw("[" * depth + "]" * depth)


def _deep_object(depth: int) -> Raw:
    return Raw('{"a":' * depth + "1" + "}" * depth)


def _long_string(size: int) -> Raw:
    return Raw('"' + "x" * size + '"')


# Made only when drawn: (a name hypothesis prints, the maker).
HUGE: tuple[tuple[str, Callable[[], Raw]], ...] = (
    ("list 100 deep", lambda: _deep_list(100)),
    ("list 1,000 deep", lambda: _deep_list(1000)),
    ("list 100,000 deep", lambda: _deep_list(100_000)),
    ("object 100,000 deep", lambda: _deep_object(100_000)),
    ("string of 100,001", lambda: _long_string(100_001)),
    ("string of 1 MB", lambda: _long_string(MB)),
    ("string of 10 MB", lambda: _long_string(10 * MB)),
    ("list of 100,000 zeros", lambda: Raw("[" + ",".join(["0"] * 100_000) + "]")),
)


def huge() -> st.SearchStrategy[Raw]:
    return st.sampled_from(HUGE).map(lambda made: made[1]())


def scalars() -> st.SearchStrategy[Any]:
    return (
        st.none()
        | st.booleans()
        | st.integers(-(2**53) + 1, 2**53 - 1)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=30)
    )


def any_json() -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=10,
    )


def wild() -> st.SearchStrategy[Any]:
    """A value where another was expected: any type, an edge number or string, a huge one."""
    return st.one_of(
        any_json(),
        st.sampled_from(EDGE_NUMBERS).map(Raw),
        st.sampled_from(EDGE_STRINGS).map(Raw),
        huge(),
    )


# Values that reach past a route's first check: a real worker, tool or model name.
HINTS: dict[str, tuple[Any, ...]] = {
    "worker": ("fake", "droid"),
    "tool": ("wallet.pay", "wallet.balance", "echo.say"),
    "tools": (["wallet.pay"], []),
    "model": ("claude-sonnet-4-6", "claude-opus-4-1"),
    "workspace": ("home",),
}


def from_schema(
    schema: dict[str, Any], defs: dict[str, Any] | None = None
) -> st.SearchStrategy[Any]:
    """Values of a JSON Schema as pydantic writes them (model_json_schema): enough of the
    keywords for the box's models, and any JSON for what it does not know."""
    defs = schema.get("$defs", {}) if defs is None else defs
    if "$ref" in schema:
        return from_schema(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    for either in ("anyOf", "oneOf"):
        if either in schema:
            return st.one_of([from_schema(s, defs) for s in schema[either]])
    kind = schema.get("type")
    if kind == "object":
        return _object(schema, defs)
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), defs), max_size=3)
    if kind == "string":
        return st.text(max_size=schema.get("maxLength", 40))
    if kind == "integer":
        return st.integers(schema.get("minimum", -1000), schema.get("maximum", 100_000))
    if kind == "number":
        return st.floats(
            schema.get("minimum", -1000.0),
            schema.get("maximum", 100_000.0),
            allow_nan=False,
            allow_infinity=False,
        )
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return any_json()


def _object(schema: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    properties: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))

    def field(name: str) -> st.SearchStrategy[Any]:
        drawn = from_schema(properties[name], defs)
        return st.sampled_from(HINTS[name]) | drawn if name in HINTS else drawn

    return st.fixed_dictionaries(
        {name: field(name) for name in properties if name in required},
        optional={name: field(name) for name in properties if name not in required},
    )


@dataclass(frozen=True)
class Body:
    """One request body as sent, with how it was broken (what hypothesis prints)."""

    how: str
    data: bytes
    content_type: str | None = "application/json"
    encoding: str | None = None


async def send(
    session: aiohttp.ClientSession,
    method: str,
    url: URL,
    body: Body | None,
    headers: Mapping[str, str],
    statuses: Collection[int] | None = None,
) -> None:
    """Sends the body as it is and checks the answer (`check_answer`); `statuses`, when
    given, are the only refusals the door may answer."""
    sent = dict(headers)
    if body is not None and body.content_type is not None:
        sent["Content-Type"] = body.content_type
    if body is not None and body.encoding is not None:
        sent["Content-Encoding"] = body.encoding
    what = f"{method} {str(url)[:200]} {body.how if body else ''}"
    async with session.request(
        method,
        url,
        data=body.data if body is not None else None,
        headers=sent,
        allow_redirects=False,
        timeout=aiohttp.ClientTimeout(total=120),
    ) as answer:
        if statuses is not None and answer.status >= 400:
            assert answer.status in statuses, (
                f"{what}: {answer.status} {(await answer.read())[:300]!r}"
            )
        check_answer(answer.status, answer.content_type, await answer.read(), what)


CONTENT_TYPES = (
    None,
    "",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json; charset=latin-1",
    "application/octet-stream",
    "\u00e9/\u00e9",
)
# A body that is not in the Content-Encoding it names; one that is, and inflates past 10 MB.
ENCODINGS = ("gzip", "deflate", "br", "zstd", "x-unknown", "gzip, gzip")


@cache
def _bomb() -> bytes:
    return gzip.compress(b'{"a": "' + b"a" * 50 * MB + b'"}', compresslevel=1)


BOMBS: tuple[Callable[[], "Body"], ...] = (
    lambda: Body("gzip of 50 MB", _bomb(), None, "gzip"),
    lambda: Body("gzip of a small body", gzip.compress(b'{"a": 1}'), None, "gzip"),
)
BAD_BYTES = (b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\x00", b"\xef\xbb\xbf", b"\xf4\x90\x80\x80")


@st.composite
def _broken_fields(draw: st.DrawFn, valid: dict[str, Any]) -> Body:
    way = draw(st.sampled_from(("wrong value", "unknown field", "key twice")))
    names = sorted(valid)
    if way == "unknown field" or not names:
        name = draw(st.text(max_size=12).filter(lambda n: n not in valid))
        value = draw(wild())
        return Body(f"{way} {name!r}", dump({**valid, name: value}).encode())
    name = draw(st.sampled_from(names))
    value = draw(wild())
    if way == "key twice":
        pairs = Pairs((*valid.items(), (name, draw(st.just(valid[name]) | wild()))))
        return Body(f"{way} {name!r}", dump(pairs).encode())
    return Body(f"{way} for {name!r}", dump({**valid, name: value}).encode())


@st.composite
def _broken_bytes(draw: st.DrawFn, valid: Any) -> Body:
    text = dump(valid).encode()
    way = draw(st.sampled_from(("bad bytes", "cut short", "empty", "not JSON at all")))
    if way == "empty":
        return Body(way, b"")
    if way == "not JSON at all":
        return Body(way, draw(st.binary(max_size=200)))
    at = draw(st.integers(0, len(text)))
    if way == "cut short":
        return Body(f"{way} at {at}", text[:at])
    bad = draw(st.sampled_from(BAD_BYTES))
    return Body(f"{way} {bad!r} at {at}", text[:at] + bad + text[at:])


def broken_bodies(schema: dict[str, Any] | None) -> st.SearchStrategy[Body]:
    """Bodies for a route that reads `schema` (None: a route that reads no body)."""
    valid = any_json() if schema is None else from_schema(schema)
    as_sent = valid.map(lambda v: Body("as drawn", dump(v).encode()))
    other_type = st.builds(
        lambda body, kind: Body(f"{body.how} as {kind!r}", body.data, kind),
        as_sent,
        st.sampled_from(CONTENT_TYPES),
    )
    encoded = st.builds(
        lambda body, encoding: Body(f"{body.how} said to be {encoding}", body.data, None, encoding),
        as_sent,
        st.sampled_from(ENCODINGS),
    )
    strategies = [
        as_sent,
        other_type,
        encoded,
        st.sampled_from(BOMBS).map(lambda made: made()),
        wild().map(lambda v: Body("a wild body", dump(v).encode())),
        valid.flatmap(_broken_bytes),
    ]
    if schema is not None and schema.get("type") == "object":
        strategies.append(valid.flatmap(_broken_fields))
    return st.one_of(strategies)


# Path segments no caller should send, already percent-encoded as they go on the wire.
EDGE_SEGMENTS = (
    "%00",
    "t%00aaaaaaaa",
    "..",
    "%2e%2e",
    "..%2f..%2fetc",
    "%2F",
    "%FF",
    "%ED%A0%80",
    "%C0%AF",
    "a" * 10_000,
    "t" + "0" * 100,
    "%20",
    "~",
    "t000000001.%0a",
    "%E2%80%AE",
)


def segments() -> st.SearchStrategy[str]:
    """A path parameter as it goes on the wire: an edge case, or any text percent-encoded."""
    return st.sampled_from(EDGE_SEGMENTS) | st.text(min_size=1, max_size=40).map(
        lambda text: quote(text, safe="")
    )


def fill_path(template: str, segment: str) -> str:
    """/api/tasks/{id}/stop with the segment in every parameter's place."""
    return re.sub(r"\{[^}]+\}", lambda _: segment, template)


# An answer reads as words: letters, no Python insides, and short enough to read.
_PYTHON_INSIDES = re.compile(r"Traceback|Error\(|<class |object at 0x")
MAX_WORDS = 2000


def check_answer(status: int, content_type: str, body: bytes, what: str) -> None:
    """The property: never a 5xx; every refusal is {"error": "..."} in plain words."""
    assert status < 500, f"{what}: {status} {body[:500]!r}"
    if status < 400:
        return
    assert content_type == "application/json", f"{what}: {status} {content_type} {body[:300]!r}"
    answer = json.loads(body)
    assert isinstance(answer, dict) and list(answer) == ["error"], f"{what}: {answer!r:.300}"
    words = answer["error"]
    assert isinstance(words, str) and re.search(r"[A-Za-z]{2,}", words), f"{what}: {words!r}"
    assert not _PYTHON_INSIDES.search(words), f"{what}: {words!r:.500}"
    assert len(words) <= MAX_WORDS, f"{what}: {len(words)} characters: {words[:300]!r}"


# The event stream is a long answer by design (its own tests: test_live_events.py).
FUZZED = [route for route in ROUTES if route.path != EVENTS_PATH]
# What each route reads; a route the broker serves without an entry here fails the first test.
BODIES: dict[str, type[BaseModel] | None] = {
    "GET /task": None,
    "GET /tools": None,
    "POST /step": Step,
    "POST /call": CallRequest,
    "POST /ask": AskRequest,
    "POST /cost": CostRequest,
    "POST /usage": UsageRequest,
}
