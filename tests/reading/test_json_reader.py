"""The broker reads its request bodies without pydantic (boxd.reading.json_reader): what it accepts
and refuses, and the words of each refusal, are what the pydantic models said before
(tests/support/old_request_models.py, kept as the oracle), field by field and for generated
garbage."""

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from boxd.broker.app import CostRequest, UsageRequest
from boxd.broker.calls import CallRequest
from boxd.errors import BoxError, Problem
from boxd.wire.approval import AskRequest
from boxd.wire.models.broker_calls import CallStart, Question
from boxd.wire.models.plain_errors import parse
from boxd.wire.step import Step
from tests.support import old_request_models as old
from tests.support.fuzz_bodies import FUZZ, Pairs, Raw, broken_bodies, dump, wild

Outcome = tuple[str, str]


def _dumped(value: dict[str, Any]) -> Outcome:
    return ("ok", json.dumps(value, sort_keys=True))


# Each route's old model, and the new reader with what the broker sends on of what it read.
ROUTES: dict[str, tuple[type[BaseModel], Callable[[bytes], dict[str, Any]], dict[str, Any]]] = {
    "step": (
        old.Step,
        lambda raw: Step.read(raw).json(),
        {"text": "read the files", "data": {"n": 1}},
    ),
    "ask": (
        old.AskRequest,
        lambda raw: AskRequest.read(raw).json(),
        {"question": "May I?", "key": "k", "costCents": 5, "payee": "p", "purpose": "q"},
    ),
    "cost": (
        old.CostRequest,
        lambda raw: vars(CostRequest.read(raw)),
        {"cents": 1.5, "what": "a search"},
    ),
    "usage": (
        old.UsageRequest,
        lambda raw: _usage(UsageRequest.read(raw)),
        {
            "model": "claude-sonnet-4-6",
            "tokens": {"input": 1, "output": 2, "cacheWrite": 3, "cacheRead": 4},
            "what": "a turn",
        },
    ),
    "call": (
        old.CallRequest,
        lambda raw: vars(CallRequest.read(raw)),
        {"tool": "echo.say", "input": {"text": "hi"}, "key": "k"},
    ),
}


def _usage(usage: UsageRequest) -> dict[str, Any]:
    return {"model": usage.model, "tokens": usage.tokens.json(), "what": usage.what}


def _old_dump(model: type[BaseModel], raw: bytes) -> dict[str, Any]:
    found = parse(model, raw)
    return found.model_dump(mode="json", exclude_none=model is old.AskRequest)


def _outcome(read: Callable[[bytes], dict[str, Any]], raw: bytes) -> Outcome:
    try:
        return _dumped(read(raw))
    except BoxError as error:
        return (error.problem.value, error.message)


def old_and_new(route: str, raw: bytes) -> tuple[Outcome, Outcome]:
    model, read, _ = ROUTES[route]
    return _outcome(lambda body: _old_dump(model, body), raw), _outcome(read, raw)


def refusal(route: str, body: str | bytes) -> str:
    """The new reader's refusal, checked to be the old model's word for word."""
    raw = body.encode() if isinstance(body, str) else body
    before, now = old_and_new(route, raw)
    assert now == before
    assert now[0] != "ok", now
    return now[1]


def test_good_bodies_read_as_before() -> None:
    for route, (_, _, good) in ROUTES.items():
        before, now = old_and_new(route, json.dumps(good).encode())
        assert now == before and now[0] == "ok", route


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"", "the body must be a JSON object"),
        (b"null", "the body must be a JSON object"),
        (b"[]", "the body must be a JSON object"),
        (b'[{"text": "a"}]', "the body must be a JSON object"),
        (b'"text"', "the body must be a JSON object"),
        (b"1", "the body must be a JSON object"),
        (b"{", "the body is not valid JSON: Expecting property name enclosed in double quotes"),
        (b'{"a": NaN}', "a: NaN is not a number"),
        (b'{"a": 1e400}', "a: 1e400 is not a finite number"),
        (b'{"a": -Infinity}', "a: -Infinity is not a number"),
        (b'{"a": 1, "a": 1}', "a is given twice"),
        (b'{"a": "\\ud800"}', "a holds a lone surrogate, so it is not UTF-8 text"),
        (b'{"a": ["x", {"b": "\\udfff\\ud800"}]}', "a.1.b holds a lone surrogate"),
        (b'{"\\udc00": 1}', "\\udc00 holds a lone surrogate"),
        (b'{"a": "\xed\xa0\x80"}', "the body is not UTF-8 text"),
        (b'\xef\xbb\xbf{"a": 1}', "the body is not valid JSON: Unexpected UTF-8 BOM"),
        ('{"a": 1}'.encode("utf-16"), "the body is not UTF-8 text"),
        (b'{"a": ' + b"[" * 200 + b"]" * 200 + b"}", "the body is nested too deeply"),
        (b'{"a": ' + b'{"a": ' * 300 + b"1" + b"}" * 301, "the body is nested too deeply"),
        (b"[" * 100_000 + b"]" * 100_000, "the body is nested too deeply"),
    ],
)
def test_broken_bodies(route: str, body: bytes, words: str) -> None:
    assert refusal(route, body).startswith(words)


@pytest.mark.parametrize(
    ("route", "body", "words"),
    [
        ("step", {}, "text is missing"),
        ("step", {"text": None}, "text must be a string"),
        ("step", {"text": 1}, "text must be a string"),
        ("step", {"text": True}, "text must be a string"),
        ("step", {"text": ["a"]}, "text must be a string"),
        ("step", {"text": "x" * 20_001}, "text is over 20,000 characters"),
        ("step", {"text": "x" * 10 * 1024 * 1024}, "the body is over 10 MB"),
        ("step", {"text": "a", "data": "x" * 1024 * 1024}, "data is over 1 MB as JSON"),
        ("step", {"text": "a", "x": 1}, "unknown field x"),
        ("step", {"x": 1, "text": 2}, "text must be a string"),
        ("step", {"x": 1, "y": 1, "text": "a"}, "unknown field x"),
        ("ask", {}, "question is missing"),
        ("ask", {"question": None}, "question: input should be a valid string"),
        ("ask", {"question": 1}, "question: input should be a valid string"),
        ("ask", {"question": " \n\t"}, "question is missing"),
        ("ask", {"question": "q" * 2001, "key": "k"}, "question is over 2000 characters"),
        ("ask", {"question": "q"}, "a key is required"),
        ("ask", {"question": "q", "key": None}, "a key is required"),
        ("ask", {"question": "q", "key": ""}, "a key is required"),
        ("ask", {"question": "q", "key": 7}, "key must be a string"),
        ("ask", {"question": "q", "key": "k" * 201}, "key is over 200 characters"),
        ("ask", {"question": "q", "key": "k", "costCents": True}, "costCents must be a number"),
        ("ask", {"question": "q", "key": "k", "costCents": "5"}, "costCents must be a number"),
        ("ask", {"question": "q", "key": "k", "costCents": -1}, "costCents must be a number"),
        ("ask", {"question": "q", "key": "k", "costCents": 1e10}, "costCents must be a number"),
        ("ask", {"question": "q", "key": "k", "payee": 1}, "payee must be a string"),
        ("ask", {"question": "q", "key": "k", "purpose": "p" * 201}, "purpose is over 200"),
        ("ask", {"key": 1, "zz": 2}, "question is missing"),
        ("ask", {"zz": 2, "question": "q", "key": "k"}, "unknown field zz"),
        ("cost", {}, "cents is missing"),
        ("cost", {"cents": False, "what": "w"}, "cents must be a number of US cents from 0"),
        ("cost", {"cents": 1}, "what is missing"),
        ("cost", {"cents": 1, "what": None}, "what must be a string"),
        ("cost", {"what": 5}, "cents is missing"),
        ("usage", {}, "model is missing"),
        ("usage", {"model": "m"}, "tokens is missing"),
        ("usage", {"model": "m", "tokens": None}, "tokens: input should be an object"),
        ("usage", {"model": "m", "tokens": [1, 2]}, "tokens: input should be an object"),
        ("usage", {"model": "m", "tokens": {}}, "tokens.input is missing"),
        ("usage", {"model": "m", "tokens": {"input": 1}}, "tokens.output is missing"),
        (
            "usage",
            {"model": "m", "tokens": {"input": True, "output": 1}},
            "tokens.input: input should be a valid integer",
        ),
        (
            "usage",
            {"model": "m", "tokens": {"input": 1.0, "output": 1}},
            "tokens.input: input should be a valid integer",
        ),
        (
            "usage",
            {"model": "m", "tokens": {"input": 1, "output": -1}},
            "tokens.output: input should be greater than or equal to 0",
        ),
        (
            "usage",
            {"model": "m", "tokens": {"input": 1, "output": 1, "cacheRead": 10**9 + 1}},
            "tokens.cacheRead: input should be less than or equal to 1000000000",
        ),
        (
            "usage",
            {"model": "m", "tokens": {"input": 1, "output": 1, "x": 1}, "what": None},
            "unknown field tokens.x",
        ),
        ("usage", {"y": 1, "model": "m", "tokens": {"input": 1, "output": 1}}, "unknown field y"),
        ("call", {}, "tool is missing"),
        ("call", {"tool": 1}, "tool must be a string"),
        ("call", {"tool": "t"}, "a key is required"),
        ("call", {"tool": "t", "key": "k", "input": "x" * 1024 * 1024}, "input is over 1 MB"),
        ("call", {"tool": "t" * 201, "key": "k"}, "tool is over 200 characters"),
    ],
)
def test_each_field_refused_in_its_words(route: str, body: Any, words: str) -> None:
    assert refusal(route, json.dumps(body)).startswith(words)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"cents": -0, "what": "w"}',
        b'{"cents": -0.0, "what": "w"}',
        b'{"cents": 5e-324, "what": "w"}',
        b'{"cents": 1e-400, "what": "w"}',
        b'{"cents": 1000000000, "what": "w"}',
        b'{"cents": 1E+2, "what": ""}',
    ],
)
def test_edge_numbers_read_as_before(raw: bytes) -> None:
    before, now = old_and_new("cost", raw)
    assert now == before and now[0] == "ok"


def _soup(route: str) -> st.SearchStrategy[bytes]:
    """A JSON object of the route's field names and others, in any order, any key maybe twice,
    each with a good value or any other."""
    good = ROUTES[route][2]
    names = st.sampled_from(sorted(good)) | st.text(max_size=6)

    def value(name: str) -> st.SearchStrategy[Any]:
        return (st.just(good[name]) if name in good else st.nothing()) | wild()

    pairs = st.lists(names.flatmap(lambda name: st.tuples(st.just(name), value(name))))
    return pairs.map(lambda drawn: dump(Pairs(tuple(drawn))).encode())


@pytest.mark.parametrize("route", list(ROUTES))
@FUZZ
@given(data=st.data())
def test_generated_bodies_read_as_before(route: str, data: st.DataObject) -> None:
    model = ROUTES[route][0]
    raw = data.draw(
        broken_bodies(model.model_json_schema()).map(lambda body: body.data) | _soup(route),
        label="body",
    )
    before, now = old_and_new(route, raw)
    assert now == before
    assert now[0] in ("ok", Problem.INVALID.value, Problem.TOO_LARGE.value)


def test_raw_values_are_written_as_they_are() -> None:
    # The oracle's bodies are sent as written: a Raw number is not quoted.
    assert dump({"a": Raw("1e400")}) == '{"a":1e400}'


ASKS = [
    {},
    {"question": None},
    {"question": 1},
    {"question": " "},
    {"question": "q" * 2001, "key": "k"},
    {"question": "q"},
    {"question": "q", "key": 7},
    {"question": "q", "key": "k" * 201},
    {"question": "q", "key": "k", "costCents": True},
    {"question": "q", "key": "k", "costCents": -1},
    {"question": "q", "key": "k", "payee": 1},
    {"question": "q", "key": "k", "purpose": "p" * 201},
    {"question": "q", "key": "k", "zz": 1},
    {"question": "q", "key": "k", "costCents": 5, "payee": "p", "purpose": "r"},
]


@pytest.mark.parametrize("body", ASKS)
def test_the_managers_question_reads_an_ask_as_the_broker_does(body: dict[str, Any]) -> None:
    # One rule, two readers: the broker's (boxd.reading.json_reader) and the manager's record of it
    # (boxd.wire.models.broker_calls.Question, pydantic, built on the same checks).
    raw = json.dumps(body).encode()
    broker = _outcome(lambda raw: AskRequest.read(raw).json(), raw)
    manager = _outcome(
        lambda raw: parse(Question, raw).model_dump(
            mode="json", exclude_none=True, exclude={"tool", "model", "inputHash"}
        ),
        raw,
    )
    assert manager == broker


@pytest.mark.parametrize("key", [None, "", 7, "k" * 201, "k"])
def test_the_managers_call_start_reads_a_key_as_the_broker_does(key: Any) -> None:
    call = {"tool": "echo.say", "input": None, "key": key}
    broker = _outcome(lambda raw: vars(CallRequest.read(raw)), json.dumps(call).encode())
    manager = _outcome(
        lambda raw: parse(CallStart, raw).model_dump(include={"tool", "input", "key"}),
        json.dumps(call).encode(),
    )
    assert manager == broker
