"""Numbers from callers are finite and bounded, and a refusal names where the number was."""

import json

import pytest

from boxd.errors import BoxError, Problem
from boxd.reading.strict_json import MAX_BODY, MAX_INTEGER, loads
from boxd.wire.models.approval_record import Answer
from boxd.wire.models.plain_errors import parse
from boxd.wire.models.settings import Settings
from boxd.wire.models.task_request import parse_task_request
from boxd.wire.step import Step


def refused(body: str | bytes) -> str:
    with pytest.raises(BoxError) as caught:
        loads(body)
    assert caught.value.problem == Problem.INVALID
    return caught.value.message


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ('{"cents": 1e999, "what": "x"}', "cents: 1e999 is not a finite number"),
        ('{"cents": -1e999}', "cents: -1e999 is not a finite number"),
        ('{"cents": NaN}', "cents: NaN is not a number"),
        ('{"cents": Infinity}', "cents: Infinity is not a number"),
        ('{"cents": -Infinity}', "cents: -Infinity is not a number"),
        ('{"a": {"b": [1, 2, NaN]}}', "a.b.2: NaN is not a number"),
        ("NaN", "the body: NaN is not a number"),
        ('{"n": 9007199254740992}', "n: 9007199254740992 is out of range"),
        ('{"n": -9007199254740992}', "n: -9007199254740992 is out of range"),
    ],
)
def test_numbers_that_are_not_numbers(body: str, words: str) -> None:
    assert refused(body).startswith(words)


def test_huge_integers_are_refused_quickly_and_shown_short() -> None:
    message = refused('{"cents": 1' + "0" * 400 + "}")
    assert message.startswith("cents: 1000000000...(401 digits) is out of range")
    assert len(message) < 120
    assert refused("[" + "9" * 100_000 + "]").startswith("0: 9999999999...(100000 digits)")


def test_good_json_reads_as_json() -> None:
    body = {"a": [1, 2.5, -3, MAX_INTEGER, -MAX_INTEGER, 1e300, None, True, "x\u001b"]}
    assert loads(json.dumps(body)) == body


def test_broken_bodies_say_why() -> None:
    assert refused(b"\xff\xfe{").startswith("the body is not")
    assert refused("{").startswith("the body is not valid JSON")
    assert refused("[" * 100_000 + "]" * 100_000) == "the body is nested too deeply"
    with pytest.raises(BoxError) as caught:
        loads(" " * (MAX_BODY + 1))
    assert caught.value.problem == Problem.TOO_LARGE


def test_every_door_reads_strictly() -> None:
    with pytest.raises(BoxError, match=r"^data.x: Infinity is not a number$"):
        Step.read('{"text": "a", "data": {"x": Infinity}}')
    with pytest.raises(BoxError, match=r"^budgetCents: 1e999 is not a finite number$"):
        parse_task_request('{"title": "t", "prompt": "p", "budgetCents": 1e999}')
    with pytest.raises(BoxError, match=r"^taskTasksMax: NaN is not a number$"):
        parse(Settings, '{"taskTasksMax": NaN}')
    # Pydantic's own words for the rest, as before.
    with pytest.raises(BoxError, match=r"^approved: input should be a valid boolean$"):
        parse(Answer, '{"approved": "yes"}')
    with pytest.raises(BoxError, match=r"^text must be a string$"):
        Step.read('{"text": 1}')


@pytest.mark.parametrize(
    ("body", "words"),
    [
        # What pydantic's reader refused, refused here in words: nothing behind the reader takes
        # it (a lone surrogate cannot be stored or sent over D-Bus; depth has no end).
        ('{"text": "\\ud800"}', "text holds a lone surrogate, so it is not UTF-8 text"),
        ('["a", "\\udfff\\ud800"]', "1 holds a lone surrogate"),
        ('{"\\ud800x": 1}', "\\ud800x holds a lone surrogate"),
        (b'{"a": "\xed\xa0\x80"}', "the body is not UTF-8 text"),
        ('{"a": 1}'.encode("utf-16"), "the body is not UTF-8 text"),
        ("[" * 201 + "]" * 201, "the body is nested too deeply"),
        ('{"a":' * 201 + "1" + "}" * 201, "the body is nested too deeply"),
    ],
)
def test_what_no_reader_behind_takes(body: str | bytes, words: str) -> None:
    assert refused(body).startswith(words)


def test_what_is_not_refused() -> None:
    assert loads('["\\ud83d\\ude00", "\\\\ud800"]') == ["\U0001f600", "\\ud800"]
    assert loads("[" * 200 + "]" * 200) is not None
    assert loads('"' + "[" * 300 + '"') == "[" * 300


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ('{"title": "a", "title": "b"}', "title is given twice"),
        ('{"data": {"x": 1, "x": 2}}', "data.x is given twice"),
        ('[{"k": 1}, {"k": 1, "k": 1}]', "1.k is given twice"),
    ],
)
def test_a_key_given_twice_is_refused_by_name(body: str, words: str) -> None:
    # Last-wins would let a proxy or a log read one value and the box act on the other.
    assert refused(body).startswith(words)


def test_every_door_refuses_a_key_given_twice() -> None:
    with pytest.raises(BoxError, match=r"^approved is given twice"):
        parse(Answer, '{"approved": false, "approved": true}')
    with pytest.raises(BoxError, match=r"^prompt is given twice"):
        parse_task_request('{"title": "t", "prompt": "p", "prompt": "q"}')
    with pytest.raises(BoxError, match=r"^data.a is given twice"):
        Step.read('{"text": "a", "data": {"a": 1, "a": 1}}')
