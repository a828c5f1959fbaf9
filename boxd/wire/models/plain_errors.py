"""Turns a pydantic ValidationError into one sentence that names the bad field."""

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from boxd.errors import BoxError, Problem
from boxd.reading.strict_json import loads

# Validators raise PydanticCustomError with this type when their text already says it all.
PLAIN = "box"


def plain(message: str) -> PydanticCustomError:
    """A validator's error whose text says it all."""
    return PydanticCustomError(PLAIN, message)


def checked(check: Callable[[Any], Any]) -> BeforeValidator:
    """A plain check (boxd.reading.caps, boxd.wire.approval: a BoxError in a sentence that names the
    field) as a pydantic validator, for the manager's records: pydantic then reports its refusal in
    field order among the others', as the broker's reader (boxd.reading.json_reader) does."""

    def run(value: Any) -> Any:
        try:
            return check(value)
        except BoxError as error:
            raise plain(error.message) from None

    return BeforeValidator(run)


def _where(error: ErrorDetails) -> str:
    return ".".join(str(part) for part in error["loc"]) or "the body"


def describe(error: ErrorDetails) -> str:
    where = _where(error)
    kind = error["type"]
    if kind == PLAIN:
        return error["msg"]
    if kind == "missing":
        return f"{where} is missing"
    if kind == "extra_forbidden":
        return f"unknown field {where}"
    if kind in ("model_type", "model_attributes_type", "dict_type") and not error["loc"]:
        return "the body must be a JSON object"
    if kind == "json_invalid":
        return f"the body is not valid JSON: {error['ctx'].get('error', 'it cannot be read')}"
    message = error["msg"]
    return f"{where}: {message[:1].lower()}{message[1:]}"


def invalid(error: ValidationError) -> BoxError:
    return BoxError(Problem.INVALID, describe(error.errors()[0]))


Model = TypeVar("Model", bound=BaseModel)


def parse(model: type[Model], body: str | bytes) -> Model:
    """Reads a JSON body into `model`, or refuses it in one sentence naming the bad field. The
    JSON is read by strict_json, so no infinity or unbounded integer reaches a model."""
    # Read by strict_json first, to refuse what pydantic's reader would take; then by pydantic,
    # for its JSON wording ("a valid array").
    loads(body or b"null")
    try:
        return model.model_validate_json(body or b"null")
    except ValidationError as error:
        raise invalid(error) from None
