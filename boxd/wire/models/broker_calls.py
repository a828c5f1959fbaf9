"""What the broker and the manager say to each other about calls, costs and questions: the
manager's models of them, whose fields are checked by the same plain checks the broker reads its
requests with (boxd.reading.caps, boxd.wire.approval), as pydantic validators
(plain_errors.checked)."""

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    StringConstraints,
)

from boxd.reading.caps import MAX_ERROR, MAX_LABEL, MAX_TOKENS, cents, cents_of, data, text
from boxd.wire import approval
from boxd.wire.models.plain_errors import checked

Key = Annotated[str, checked(approval.key)]
Label = Annotated[str, checked(text("tool", MAX_LABEL))]
Cents = Annotated[float, checked(cents)]


class CallStart(BaseModel):
    """A call begun: its key, tool, validated input and what the tool says it costs. Its
    `tool.call` line adds the input's hash (boxd.wire.models.key_use): the key names this call for
    good."""

    model_config = ConfigDict(extra="forbid")

    key: Key
    tool: Label
    input: Annotated[Any, checked(data("input"))] = None
    costCents: Cents = 0
    # The key of the same call, running already, whose run this one shares: the result logged
    # for that key is logged for this one in the same commit, so a broker killed in between
    # leaves no key of the run unanswered, to run it again when the task asks again.
    sharesWith: Key | None = None


class CallResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: Key
    tool: Label
    ok: StrictBool
    output: Annotated[Any, checked(data("output"))] = None
    error: Annotated[str, checked(text("error", MAX_ERROR))] | None = None
    costCents: Cents = 0
    # The key of the call whose run this one shared.
    sharedWith: Key | None = None

    def answer(self) -> dict[str, Any]:
        """What the caller sees, now and every time it asks with this key again."""
        if self.ok:
            return {"ok": True, "output": self.output}
        return {"ok": False, "error": self.error or "the tool failed"}


class CostRecord(BaseModel):
    """The data of a `cost` event: spending in US cents, not rounded. `reserved` marks a model
    request charged what was reserved for it, since its reply never said what it cost."""

    model_config = ConfigDict(extra="forbid")

    cents: Annotated[float, checked(cents_of("cents"))]
    what: Annotated[str, checked(text("what", MAX_LABEL))]
    model: Annotated[str, checked(text("model", MAX_LABEL))] | None = None
    tokens: (
        dict[
            Annotated[str, checked(text("tokens", MAX_LABEL))],
            Annotated[int, Field(ge=0, le=MAX_TOKENS)],
        ]
        | None
    ) = None
    reserved: StrictBool | None = None


# Far above what a task can be refused in a broker's life, and exact in a JSON reader's double.
MAX_REFUSAL_COUNT = 2**53 - 1


class NetRefusal(BaseModel):
    """The data of a `net.refused` event: where the task tried to go, and why it may not."""

    model_config = ConfigDict(extra="forbid")

    target: Annotated[StrictStr, StringConstraints(max_length=1000)]
    reason: Annotated[StrictStr, StringConstraints(max_length=1000)]
    # How many refusals this event stands for: the broker logs at most one a second per host.
    count: Annotated[StrictInt, Field(ge=1, le=MAX_REFUSAL_COUNT)] = 1


Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class Question(BaseModel):
    """An /ask (boxd.wire.approval.AskRequest, checked the same), or the OK an over-budget /call
    needs (`tool` names the call it is for)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    question: Annotated[str, checked(approval.question)]
    key: Key = ""
    costCents: Cents | None = None
    payee: Annotated[str, checked(approval.payee)] | None = None
    purpose: Annotated[str, checked(approval.purpose)] | None = None
    tool: Label | None = None


# A model request's own id, made by its gateway: 64 random bits in hex.
RequestId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]
TokenCount = Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]


# Calls one broker has in flight at once: at most one a connection to broker.sock.
MAX_CALLS_IN_FLIGHT = 1024


class ModelStart(BaseModel):
    """A model request the gateway is about to forward: its id, the sha256 of its body, and
    what its worst case is made from: the estimate of its input tokens, its max_tokens and
    whether it writes to the 1-hour cache; and what the broker's calls in flight reserve, by
    their keys (a call waiting for the owner is also the record's: counted once)."""

    model_config = ConfigDict(extra="forbid")

    request: RequestId
    requestHash: Sha256
    inputTokens: TokenCount
    maxTokens: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)]
    hourCache: StrictBool
    inFlight: Annotated[dict[Key, Cents], Field(max_length=MAX_CALLS_IN_FLIGHT)] = {}


class ModelTokens(BaseModel):
    """A reply's token counts, as boxd.wire.pricing.Tokens names them."""

    model_config = ConfigDict(extra="forbid")

    input: TokenCount = 0
    output: TokenCount = 0
    cacheWrite: TokenCount = 0
    cacheRead: TokenCount = 0
    cacheWrite1h: TokenCount = 0


class ModelCost(BaseModel):
    """What a forwarded request's reply said so far (cumulative counts): at its `start`
    (message_start's, logged as soon as they passed) or at its `end` (all of them, the reply's
    status, whether the request was sent whole (status 0: no answer came), and whether the reply
    said its final usage: if not, it is charged the most it could have cost)."""

    model_config = ConfigDict(extra="forbid")

    request: RequestId
    part: Literal["start", "end"]
    tokens: ModelTokens = ModelTokens()
    status: Annotated[StrictInt, Field(ge=0, le=999)] = 0
    sent: StrictBool = False
    complete: StrictBool = False
