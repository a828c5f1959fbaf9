"""The broker's request models as they were in pydantic, before the broker read its requests
with boxd.reading.json_reader: kept here only as the oracle the reader is compared with
(tests/reading/test_json_reader.py), word for word, and for the schemas the fuzz tests draw bodies
from (tests/broker/test_fuzz_broker.py). Copied from boxd as it was, not from what it is now."""

import math
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    field_validator,
)
from pydantic_core import PydanticCustomError

from boxd.reading.strict_json import size

MAX_CENTS = 1_000_000_000
MAX_TOKENS = 1_000_000_000
MAX_STEP_TEXT = 20_000
MAX_DATA = 1024 * 1024
MAX_DATA_WORDS = "1 MB"
MAX_LABEL = 200
MAX_KEY = 200
MAX_QUESTION = 2000


def _plain(message: str) -> PydanticCustomError:
    return PydanticCustomError("box", message)


def text_of(field: str, limit: int) -> BeforeValidator:
    def check(value: object) -> str:
        if not isinstance(value, str):
            raise _plain(f"{field} must be a string")
        if len(value) > limit:
            raise _plain(f"{field} is over {limit:,} characters")
        return value

    return BeforeValidator(check)


def data_of(field: str, limit: int = MAX_DATA) -> BeforeValidator:
    def check(value: object) -> Any:
        try:
            shown = size(value)
        except (TypeError, ValueError, RecursionError):
            raise _plain(f"{field} is not a JSON value") from None
        if shown > limit:
            raise _plain(f"{field} is over {MAX_DATA_WORDS} as JSON ({shown:,} characters)")
        return value

    return BeforeValidator(check)


def cents(value: object, field: str = "costCents") -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_CENTS
    ):
        raise _plain(f"{field} must be a number of US cents from 0 to {MAX_CENTS:,}")
    return float(value)


def key(value: object) -> str:
    if value is None or value == "":
        raise _plain("a key is required")
    if not isinstance(value, str):
        raise _plain("key must be a string")
    if len(value) > MAX_KEY:
        raise _plain(f"key is over {MAX_KEY} characters")
    return value


Key = Annotated[str, BeforeValidator(key)]


class Step(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)

    text: Annotated[str, text_of("text", MAX_STEP_TEXT)]
    data: Annotated[Any, data_of("data")] = None


class AskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, defer_build=True)

    question: StrictStr
    key: Key = ""
    costCents: Annotated[float, BeforeValidator(cents)] | None = None
    payee: Annotated[str, text_of("payee", MAX_LABEL)] | None = None
    purpose: Annotated[str, text_of("purpose", MAX_LABEL)] | None = None

    @field_validator("question")
    @classmethod
    def _question(cls, value: str) -> str:
        if not value.strip():
            raise _plain("question is missing")
        if len(value) > MAX_QUESTION:
            raise _plain(f"question is over {MAX_QUESTION} characters")
        return value


Count = Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]


class Tokens(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    input: Count
    output: Count
    cacheWrite: Count = 0
    cacheRead: Count = 0


class CostRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)

    cents: Annotated[float, BeforeValidator(lambda v: cents(v, "cents"))]
    what: Annotated[str, text_of("what", MAX_LABEL)]


class UsageRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)

    model: Annotated[str, text_of("model", MAX_LABEL)]
    tokens: Tokens
    what: Annotated[str, text_of("what", MAX_LABEL)] = "model"


class CallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, defer_build=True)

    tool: Annotated[str, text_of("tool", MAX_LABEL)]
    input: Annotated[Any, data_of("input")] = None
    key: Key = ""
