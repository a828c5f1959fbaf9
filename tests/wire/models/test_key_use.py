"""A key names one thing: one call (tool, input hash, cost), one question or one model request."""

import hashlib

from boxd.wire.approval import ApprovalState
from boxd.wire.models.approval_record import Approval
from boxd.wire.models.key_use import (
    CallUse,
    ModelUse,
    QuestionUse,
    approval_use,
    first_refusal,
    input_hash,
    logged_call_use,
    refusal,
)

PAY = CallUse("wallet.pay", input_hash({"to": "Ada", "cents": 30}), 30)


def test_the_hash_is_of_canonical_json() -> None:
    assert input_hash({"to": "Ada", "cents": 30}) == input_hash({"cents": 30, "to": "Ada"})
    canonical = '{"cents":30,"to":"Adé"}'.encode()
    assert input_hash({"to": "Adé", "cents": 30}) == hashlib.sha256(canonical).hexdigest()
    assert input_hash({"to": "Ada", "cents": 30}) != input_hash({"to": "Ada", "cents": 31})


def test_the_same_call_is_no_refusal() -> None:
    assert refusal("k", PAY, PAY) is None
    assert refusal("q", QuestionUse("May I?"), QuestionUse("May I?")) is None


def test_a_question_key_never_names_a_call() -> None:
    assert refusal("k", QuestionUse("May I read the news?"), PAY) == (
        "key k was used for a question (POST /ask); a call needs a key of its own"
    )
    assert refusal("k", PAY, QuestionUse("May I?")) == (
        "key k was used for a call of wallet.pay; a question needs a key of its own"
    )


def test_another_tool_input_or_cost_is_refused() -> None:
    echo = CallUse("echo.say", PAY.inputHash, 30)
    assert refusal("k", PAY, echo) == (
        "key k was used for a call of wallet.pay; a new call needs a new key"
    )
    mallory = CallUse("wallet.pay", input_hash({"to": "Mallory", "cents": 30}), 30)
    assert refusal("k", PAY, mallory) == (
        "key k was used for a call of wallet.pay with another input; a new call needs a new key"
    )
    dearer = CallUse("wallet.pay", PAY.inputHash, 3000)
    assert refusal("k", PAY, dearer) == (
        "key k was used for a call of wallet.pay costing 30 cents, not 3000; "
        "a new call needs a new key"
    )


def test_another_question_is_refused() -> None:
    assert refusal("q", QuestionUse("May I?"), QuestionUse("May I pay?")) == (
        "key q was used for another question; a new question needs a new key"
    )
    assert refusal("q", QuestionUse("Pay?", 5), QuestionUse("Pay?", 5000)) is not None


def test_older_records_compare_what_they_kept() -> None:
    # A tool.call line from before hashes were logged: the hash is made from its input.
    old_line = {"key": "k", "tool": "wallet.pay", "input": {"to": "Ada", "cents": 30}}
    assert logged_call_use(old_line) == CallUse("wallet.pay", PAY.inputHash, None)
    assert refusal("k", logged_call_use(old_line), PAY) is None
    old_approval = CallUse("wallet.pay", None, 30)
    assert refusal("k", old_approval, PAY) is None
    assert first_refusal("k", (old_approval, logged_call_use(old_line)), PAY) is None
    assert first_refusal("k", (old_approval, QuestionUse("?")), PAY) is not None


REQUEST = ModelUse(hashlib.sha256(b'{"messages":[]}').hexdigest())


def test_a_model_request_key_names_nothing_else() -> None:
    """The gateway's `model.<hash>` keys and the worker's own keys never stand for each other,
    whichever came first: an owner's yes to a question that reads like the gateway's is no
    yes to a model request, nor the other way round."""
    assert refusal("k", REQUEST, REQUEST) is None
    assert refusal("k", QuestionUse("Let the model answer?"), REQUEST) == (
        "key k was used for a question (POST /ask); a model request needs a key of its own"
    )
    assert refusal("k", PAY, REQUEST) == (
        "key k was used for a call of wallet.pay; a model request needs a key of its own"
    )
    assert refusal("k", REQUEST, PAY) == (
        "key k was used for a model request; a call needs a key of its own"
    )
    assert refusal("k", REQUEST, QuestionUse("Let the model answer?")) == (
        "key k was used for a model request; a question needs a key of its own"
    )
    other = ModelUse(hashlib.sha256(b"{}").hexdigest())
    assert refusal("k", REQUEST, other) == (
        "key k was used for another model request; a new request needs a new key"
    )


def test_a_model_approval_is_a_model_use() -> None:
    model = Approval(
        id="t000000001.model.x",
        task="t000000001",
        key="model.x",
        state=ApprovalState.PENDING,
        question="Let the model answer?",
        model="claude-sonnet-4-6",
        inputHash=REQUEST.requestHash,
        askedAt=1.0,
    )
    assert approval_use(model) == REQUEST
    question = model.model_copy(update={"model": None, "inputHash": None})
    assert approval_use(question) == QuestionUse("Let the model answer?")
