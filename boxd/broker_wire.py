"""What the broker and the manager say to each other about calls, costs and questions."""

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    StringConstraints,
)

from boxd.approval import AskRequest, Key, cents


class CallStart(BaseModel):
    """A call begun: its key, tool, validated input and what the tool says it costs. Its
    `tool.call` line adds the input's hash (boxd.key_use): the key names this call for good."""

    model_config = ConfigDict(extra="forbid")

    key: Key
    tool: StrictStr
    input: Any = None
    costCents: Annotated[float, BeforeValidator(cents)] = 0


class CallResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: Key
    tool: StrictStr
    ok: StrictBool
    output: Any = None
    error: StrictStr | None = None
    costCents: Annotated[float, BeforeValidator(cents)] = 0
    # The key of the call whose run this one shared.
    sharedWith: StrictStr | None = None

    def answer(self) -> dict[str, Any]:
        """What the caller sees, now and every time it asks with this key again."""
        if self.ok:
            return {"ok": True, "output": self.output}
        return {"ok": False, "error": self.error or "the tool failed"}


class CostRecord(BaseModel):
    """The data of a `cost` event: spending in US cents, not rounded."""

    model_config = ConfigDict(extra="forbid")

    cents: Annotated[float, BeforeValidator(lambda v: cents(v, "cents"))]
    what: StrictStr
    model: StrictStr | None = None
    tokens: dict[str, int] | None = None


# Far above what a task can be refused in a broker's life, and exact in a JSON reader's double.
MAX_REFUSAL_COUNT = 2**53 - 1


class NetRefusal(BaseModel):
    """The data of a `net.refused` event: where the task tried to go, and why it may not."""

    model_config = ConfigDict(extra="forbid")

    target: Annotated[StrictStr, StringConstraints(max_length=1000)]
    reason: Annotated[StrictStr, StringConstraints(max_length=1000)]
    # How many refusals this event stands for: the broker logs at most one a second per host.
    count: Annotated[StrictInt, Field(ge=1, le=MAX_REFUSAL_COUNT)] = 1


class Question(AskRequest):
    """An /ask, or the OK an over-budget /call needs; `tool` names the call it is for."""

    tool: StrictStr | None = None
