from typing import Any

import pytest

from boxd.errors import BoxError, Problem
from boxd.wire.pricing import PRICES, Tokens, price_cents


def test_sonnet_example_from_the_broker_spec() -> None:
    tokens = Tokens(input=12000, output=900, cacheWrite=0, cacheRead=48000)
    expected = 12000 * 3 / 1e6 * 100 + 900 * 15 / 1e6 * 100 + 48000 * 0.3 / 1e6 * 100
    assert price_cents("claude-sonnet-4-6", tokens) == pytest.approx(expected, abs=1e-9)
    assert price_cents("claude-sonnet-4-6", tokens) == pytest.approx(6.39, abs=1e-9)


@pytest.mark.parametrize(
    ("model", "prices"),
    [
        ("claude-opus-4-6", (5, 25, 6.25, 0.50)),
        ("claude-opus-4-5", (5, 25, 6.25, 0.50)),
        ("claude-opus-4-1", (15, 75, 18.75, 1.50)),
        ("claude-opus-4", (15, 75, 18.75, 1.50)),
        ("claude-sonnet-4-6", (3, 15, 3.75, 0.30)),
        ("claude-sonnet-4-5", (3, 15, 3.75, 0.30)),
        ("claude-sonnet-4", (3, 15, 3.75, 0.30)),
        ("claude-haiku-4-5", (1, 5, 1.25, 0.10)),
        ("claude-3-5-haiku", (0.80, 4, 1, 0.08)),
    ],
)
def test_each_kind_of_token_at_its_rate(model: str, prices: tuple[float, ...]) -> None:
    million = 1_000_000
    kinds = [
        Tokens(input=million, output=0),
        Tokens(input=0, output=million),
        Tokens(input=0, output=0, cacheWrite=million),
        Tokens(input=0, output=0, cacheRead=million),
    ]
    cents = [price_cents(model, tokens) for tokens in kinds]
    assert cents == pytest.approx([dollars * 100 for dollars in prices])


def test_not_rounded() -> None:
    assert price_cents("claude-haiku-4-5", Tokens(input=1, output=0)) == pytest.approx(0.0001)


@pytest.mark.parametrize(
    ("dated", "model"),
    [
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-opus-4-1-20250805", "claude-opus-4-1"),
        ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("claude-3-5-haiku-20241022", "claude-3-5-haiku"),
    ],
)
def test_dated_ids_cost_what_their_model_costs(dated: str, model: str) -> None:
    tokens = Tokens(input=1234, output=567, cacheWrite=89, cacheRead=10)
    assert price_cents(dated, tokens) == price_cents(model, tokens)


@pytest.mark.parametrize(
    "model", ["gpt-4o", "claude-sonnet-9", "claude-sonnet-4-5-2025", "sonnet", "claude-sonnet-4-6x"]
)
def test_unknown_model(model: str) -> None:
    with pytest.raises(BoxError) as caught:
        price_cents(model, Tokens(input=1, output=1))
    assert caught.value.problem is Problem.INVALID
    assert caught.value.message.startswith(f"unknown model {model}: the box has prices for ")
    assert all(known in caught.value.message for known in PRICES)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"output": 1}, "tokens.input is missing"),
        ({"input": -1, "output": 1}, "tokens.input: input should be greater than or equal to 0"),
        ({"input": 1, "output": 1.5}, "tokens.output: input should be a valid integer"),
        ({"input": 1, "output": "2"}, "tokens.output: input should be a valid integer"),
        ({"input": 1, "output": 1, "cacheRead": True}, "tokens.cacheRead: input should be a"),
        ({"input": 1, "output": 1, "cached": 3}, "unknown field tokens.cached"),
        ([1, 2], "tokens: input should be an object"),
    ],
)
def test_bad_token_counts(body: Any, words: str) -> None:
    with pytest.raises(BoxError) as caught:
        Tokens.read(body, ("tokens",))
    assert caught.value.message.startswith(words)
