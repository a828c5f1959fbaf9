"""The Droid worker's answers: AskUser as the owner's approvals through POST /ask, permissions
by the task's autonomy."""

from typing import Any

import pytest

from boxd.reading.canonical_json import input_hash
from boxd.wire.approval import MAX_KEY, MAX_QUESTION
from boxd.workers.droid.answers import NO, YES, Answers, ask_key, owner_question
from boxd.workers.droid.rpc import Question, read_permission
from tests.support.droid_fixtures import exec_permission_params, plan_permission_params


class FakeBroker:
    """Answers /ask from a script, one answer per request, and records the requests."""

    def __init__(self, *answers: Any) -> None:
        self.asked: list[dict[str, Any]] = []
        self._answers = list(answers)

    async def post(self, path: str, body: Any) -> Any:
        assert path == "/ask"
        self.asked.append(body)
        return self._answers.pop(0)


def question(text: str, *options: str) -> Question:
    return Question(index=1, question=text, topic="Colour", options=options, multi=False)


def answers(broker: FakeBroker, autonomy: str = "low", plan: bool = False) -> Answers:
    return Answers(broker.post, autonomy=autonomy, plan=plan)


async def test_a_question_is_an_approval_keyed_by_its_hash_and_yes_is_said_in_words() -> None:
    broker = FakeBroker({"approved": True})
    said = await answers(broker).ask_user((question("Should it be red?", "Yes", "No"),))
    assert said == [YES]
    text = "Droid asks: Should it be red? (Droid suggested: Yes / No)"
    assert broker.asked == [{"question": text, "key": f"droid.ask.{input_hash(text)}"}]


async def test_no_is_said_in_words() -> None:
    said = await answers(FakeBroker({"approved": False})).ask_user((question("Red?"),))
    assert said == [NO]
    assert "did not approve" in NO


async def test_pending_is_asked_again_with_the_same_key_until_answered() -> None:
    broker = FakeBroker({"pending": True}, {"pending": True}, {"approved": True})
    assert await answers(broker).ask_user((question("Red?", "Yes", "No"),)) == [YES]
    assert len(broker.asked) == 3
    assert len({body["key"] for body in broker.asked}) == 1


async def test_each_question_is_its_own_approval() -> None:
    broker = FakeBroker({"approved": True}, {"approved": False})
    said = await answers(broker).ask_user((question("Red?"), question("Round?")))
    assert said == [YES, NO]
    assert broker.asked[0]["key"] != broker.asked[1]["key"]


def test_the_same_question_is_the_same_key_after_a_restart() -> None:
    first = owner_question(question("Red?", "Yes", "No"))
    again = owner_question(question("Red?", "Yes", "No"))
    assert ask_key(first) == ask_key(again)
    assert ask_key(first) != ask_key(owner_question(question("Red?", "Yes", "No", "Maybe")))


def test_a_long_question_fits_the_broker() -> None:
    text = owner_question(question("x" * 5000, "Yes"))
    assert len(text) == MAX_QUESTION
    assert len(ask_key(text)) <= MAX_KEY


async def test_an_answer_that_is_not_one_is_an_error_not_a_yes() -> None:
    with pytest.raises(ValueError, match="the broker answered /ask with"):
        await answers(FakeBroker({"ok": True})).ask_user((question("Red?"),))


async def test_what_the_autonomy_does_not_allow_is_refused_and_remembered() -> None:
    worker = answers(FakeBroker(), autonomy="low")
    chosen = await worker.permission(read_permission(exec_permission_params("rm -rf build")))
    assert chosen == "cancel"
    assert worker.refused == [
        "Droid needed permission for Execute rm -rf build, which --auto low does not allow; "
        "a task with a higher droid.autonomy may do it"
    ]


async def test_even_high_autonomy_never_says_yes_to_more() -> None:
    """At high, Droid asks only for what even high does not allow."""
    worker = answers(FakeBroker(), autonomy="high")
    request = read_permission(exec_permission_params("rm -rf /"))
    assert await worker.permission(request) == "cancel"


async def test_a_plan_the_task_asked_for_goes_on_at_the_tasks_autonomy() -> None:
    worker = answers(FakeBroker(), autonomy="medium", plan=True)
    chosen = await worker.permission(read_permission(plan_permission_params("1. Write a.txt")))
    assert chosen == "proceed_auto_run_medium"
    assert worker.refused == []


async def test_a_plan_the_task_did_not_ask_for_is_refused() -> None:
    worker = answers(FakeBroker(), autonomy="low", plan=False)
    chosen = await worker.permission(read_permission(plan_permission_params("1. Write a.txt")))
    assert chosen == "cancel"
    assert worker.refused


async def test_a_plan_without_a_way_on_at_the_tasks_autonomy_is_refused() -> None:
    params = plan_permission_params("1. Write a.txt")
    params["options"] = [{"value": "proceed_once"}, {"value": "cancel"}]
    worker = answers(FakeBroker(), autonomy="low", plan=True)
    assert await worker.permission(read_permission(params)) == "cancel"
    assert worker.refused == ["Droid offered no way to carry on with its plan at autonomy low"]
