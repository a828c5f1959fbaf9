"""Every field a task sends through its broker has a cap, and cents have a ceiling."""

import json

import pytest

from boxd.broker.app import CostRequest, UsageRequest
from boxd.errors import BoxError
from boxd.reading.caps import MAX_CENTS, MAX_DATA, MAX_STEP_TEXT, MAX_TOKENS, MAX_TOOLS
from boxd.wire.approval import AskRequest
from boxd.wire.models.broker_calls import CallResult, CallStart, CostRecord
from boxd.wire.models.plain_errors import parse
from boxd.wire.models.task_request import parse_task_request
from boxd.wire.step import Step


def refusal(model: type, body: object) -> str:
    """The refusal of a request the broker reads (its `read`) or of a manager's record."""
    with pytest.raises(BoxError) as caught:
        raw = json.dumps(body)
        model.read(raw.encode()) if hasattr(model, "read") else parse(model, raw)
    return caught.value.message


def test_cents_are_bounded_everywhere() -> None:
    words = f"must be a number of US cents from 0 to {MAX_CENTS:,}"
    assert refusal(CostRequest, {"cents": MAX_CENTS + 1, "what": "x"}) == f"cents {words}"
    assert refusal(CostRequest, {"cents": -0.5, "what": "x"}) == f"cents {words}"
    assert refusal(CostRecord, {"cents": 1e300, "what": "x"}) == f"cents {words}"
    assert refusal(AskRequest, {"question": "q", "key": "k", "costCents": 1e20}) == (
        f"costCents {words}"
    )
    assert refusal(CallResult, {"key": "k", "tool": "t", "ok": True, "costCents": 1e10}) == (
        f"costCents {words}"
    )
    assert (
        CostRequest.read(json.dumps({"cents": MAX_CENTS, "what": "x"}).encode()).cents == MAX_CENTS
    )


def test_token_counts_are_bounded() -> None:
    body = {"model": "claude-sonnet-4-6", "tokens": {"input": MAX_TOKENS + 1, "output": 0}}
    assert refusal(UsageRequest, body).startswith("tokens.input: input should be less than")
    record = {"cents": 1, "what": "m", "tokens": {"input": MAX_TOKENS + 1}}
    assert refusal(CostRecord, record).startswith("tokens.input: input should be less than")


def test_texts_and_values_are_capped() -> None:
    assert refusal(Step, {"text": "x" * (MAX_STEP_TEXT + 1)}) == "text is over 20,000 characters"
    big = {"blob": "x" * MAX_DATA}
    assert refusal(Step, {"text": "a", "data": big}).startswith("data is over 1 MB as JSON")
    assert refusal(CallStart, {"key": "k", "tool": "t", "input": big}).startswith(
        "input is over 1 MB"
    )
    assert refusal(CallResult, {"key": "k", "tool": "t", "ok": True, "output": big}).startswith(
        "output is over 1 MB"
    )
    assert refusal(CostRequest, {"cents": 1, "what": "w" * 201}) == "what is over 200 characters"
    assert refusal(AskRequest, {"question": "q", "key": "k", "payee": "p" * 201}) == (
        "payee is over 200 characters"
    )
    with pytest.raises(BoxError, match=f"tools has {MAX_TOOLS + 1} names"):
        parse_task_request(
            json.dumps({"title": "t", "prompt": "p", "tools": ["echo.say"] * (MAX_TOOLS + 1)})
        )
