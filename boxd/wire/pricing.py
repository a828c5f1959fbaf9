"""What a model call cost, from its token counts and the model's list prices."""

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass

from boxd.errors import Problem, die
from boxd.reading.caps import MAX_TOKENS
from boxd.reading.json_reader import Fields
from boxd.reading.strict_json import where


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens."""

    input: float
    output: float
    cache_write: float
    cache_read: float

    @property
    def cache_write_1h(self) -> float:
        """A 1-hour cache write costs twice the input price, on every model."""
        return 2 * self.input

    @property
    def dearest_input(self) -> float:
        """The most an input token can cost: written to the 1-hour cache."""
        return max(self.input, self.cache_write, self.cache_write_1h)


_OPUS_4_5 = Price(input=5, output=25, cache_write=6.25, cache_read=0.50)
_OPUS_4 = Price(input=15, output=75, cache_write=18.75, cache_read=1.50)
_SONNET = Price(input=3, output=15, cache_write=3.75, cache_read=0.30)
_HAIKU_4_5 = Price(input=1, output=5, cache_write=1.25, cache_read=0.10)
_HAIKU_3_5 = Price(input=0.80, output=4, cache_write=1, cache_read=0.08)
_HAIKU_3 = Price(input=0.25, output=1.25, cache_write=0.30, cache_read=0.03)

# Anthropic's list prices (https://www.anthropic.com/pricing and the "Pricing" page of the
# Claude docs) as known in February 2026; check them there before trusting a bill. Cache write
# is the 5-minute cache write; the 1-hour one is twice the input price. Not modelled, because the
# model gateway refuses what would incur them (boxd/broker/model/allowlist.py): the long-context
# rates above 200k input tokens (the 1M-context beta), server tools (web search, code execution),
# other service tiers, data residency; batch discounts (another endpoint).
PRICES: dict[str, Price] = {
    "claude-opus-4-6": _OPUS_4_5,
    "claude-opus-4-5": _OPUS_4_5,
    "claude-opus-4-1": _OPUS_4,
    "claude-opus-4": _OPUS_4,
    "claude-opus-4-0": _OPUS_4,
    "claude-sonnet-4-6": _SONNET,
    "claude-sonnet-4-5": _SONNET,
    "claude-sonnet-4": _SONNET,
    "claude-sonnet-4-0": _SONNET,
    "claude-3-7-sonnet": _SONNET,
    "claude-haiku-4-5": _HAIKU_4_5,
    "claude-3-5-haiku": _HAIKU_3_5,
    "claude-3-haiku": _HAIKU_3,
}

# Models are also named with their snapshot date, e.g. claude-sonnet-4-5-20250929.
_DATED = re.compile(r"-\d{8}\Z")


def _count(path: tuple[str, ...]) -> Callable[[object], int]:
    """A token count: a JSON integer from 0 to MAX_TOKENS (not 1.0, not true), refused in
    pydantic's words, as before."""

    def check(value: object) -> int:
        if type(value) is not int:
            die(Problem.INVALID, f"{where(path)}: input should be a valid integer")
        if value < 0:
            die(Problem.INVALID, f"{where(path)}: input should be greater than or equal to 0")
        if value > MAX_TOKENS:
            die(
                Problem.INVALID,
                f"{where(path)}: input should be less than or equal to {MAX_TOKENS}",
            )
        return value

    return check


@dataclass(frozen=True)
class Tokens:
    """The token counts of a model call: a /usage's `tokens`, or what the gateway read."""

    input: int
    output: int
    cacheWrite: int = 0
    cacheRead: int = 0
    # Of cacheWrite, the tokens written to the 1-hour cache, priced at twice the input price.
    cacheWrite1h: int = 0

    @classmethod
    def read(cls, value: object, path: tuple[str, ...]) -> "Tokens":
        fields = Fields(value, path)
        tokens = cls(
            fields.required("input", _count(fields.path("input"))),
            fields.required("output", _count(fields.path("output"))),
            fields.optional("cacheWrite", _count(fields.path("cacheWrite")), 0),
            fields.optional("cacheRead", _count(fields.path("cacheRead")), 0),
            fields.optional("cacheWrite1h", _count(fields.path("cacheWrite1h")), 0),
        )
        fields.done()
        if tokens.cacheWrite1h > tokens.cacheWrite:
            die(
                Problem.INVALID,
                f"{where((*path, 'cacheWrite1h'))}: the 1-hour cache writes are a part of "
                "cacheWrite, so never more than it",
            )
        return tokens

    def json(self) -> dict[str, int]:
        """The counts; cacheWrite1h only where there were any, as most replies have none."""
        counts = asdict(self)
        if not self.cacheWrite1h:
            del counts["cacheWrite1h"]
        return counts


def price_of(model: str) -> Price:
    found = PRICES.get(_DATED.sub("", model))
    if found is None:
        die(
            Problem.INVALID,
            f"unknown model {model}: the box has prices for {', '.join(sorted(PRICES))}",
        )
    return found


def price_cents(model: str, tokens: Tokens) -> float:
    """US cents at list price, not rounded: many small calls must add up to the right sum."""
    price = price_of(model)
    micro_dollars = (
        tokens.input * price.input
        + tokens.output * price.output
        + (tokens.cacheWrite - tokens.cacheWrite1h) * price.cache_write
        + tokens.cacheWrite1h * price.cache_write_1h
        + tokens.cacheRead * price.cache_read
    )
    # Tokens times dollars per million tokens is in millionths of a dollar; a cent is 10,000.
    return micro_dollars / 10_000


def reservation_cents(
    model: str, input_tokens: int, max_tokens: int, hour_cache: bool
) -> tuple[float, float]:
    """The most a model request can cost, as (its input, its output): every input token at the
    dearest rate it may be billed (a cache write, to the 1-hour cache where the request asks for
    one), and max_tokens of output."""
    price = price_of(model)
    per_input = price.dearest_input if hour_cache else max(price.input, price.cache_write)
    return input_tokens * per_input / 10_000, max_tokens * price.output / 10_000
