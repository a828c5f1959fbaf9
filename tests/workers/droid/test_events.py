"""Droid's session notifications, as Droid 0.225.2 sent them over JSON-RPC against a scripted
model (`droid.session_notification`'s `notification`, with its `sessionId`)."""

from typing import Any

from boxd.reading.caps import MAX_STEP_TEXT
from boxd.workers.agent_events import Kind
from boxd.workers.droid.events import Notifications

SESSION = "07821474-dc48-4a8f-8f70-04ef5bed23ca"
MODEL = "claude-sonnet-4-6"


def created(role: str, *content: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "create_message",
        "sessionId": SESSION,
        "message": {
            "id": "d74ed7e8-6f96-421f-971d-925a331a8f5d",
            "role": role,
            "content": list(content),
            "createdAt": 1796281735915,
            "parentId": "ac3711a7-eb90-43b8-b11d-63469173de93",
        },
    }


def text(words: str) -> dict[str, Any]:
    return {"type": "text", "text": words}


def tool_use(name: str, tool_input: dict[str, Any], ident: str = "toolu_1_1") -> dict[str, Any]:
    return {"type": "tool_use", "id": ident, "name": name, "input": tool_input}


def tool_result(content: str, *, error: bool, ident: str = "toolu_1_1") -> dict[str, Any]:
    return {
        "type": "tool_result",
        "sessionId": SESSION,
        "toolUseId": ident,
        "messageId": "9a72daea-f7d8-4362-80a8-5c4cbe9344e1",
        "content": content,
        "isError": error,
    }


def turn_completed(reason: str = "completed") -> dict[str, Any]:
    return {
        "type": "agent_turn_completed",
        "sessionId": SESSION,
        "reason": reason,
        "turnId": "ac3711a7-eb90-43b8-b11d-63469173de93",
        "durationMs": 1314,
    }


def reader() -> Notifications:
    return Notifications(SESSION, MODEL)


def test_the_start_is_the_first_step_and_names_the_session() -> None:
    assert reader().started(resumed=False) == {
        "text": f"Droid started working, on {MODEL}",
        "data": {"session": SESSION, "kind": Kind.STARTED},
    }


def test_the_users_prompt_is_not_a_step() -> None:
    assert reader().read(created("user", text("pay bob"))).steps == ()


def test_an_assistant_message_is_a_step() -> None:
    seen = reader().read(created("assistant", text("Paying bob now.")))
    assert seen.steps == (
        {"text": "Paying bob now.", "data": {"session": SESSION, "kind": Kind.MESSAGE}},
    )


def test_words_then_a_tool_are_two_steps_in_order() -> None:
    seen = reader().read(
        created("assistant", text("I need to know."), tool_use("AskUser", {"questionnaire": "q"}))
    )
    assert [step["data"]["kind"] for step in seen.steps] == [Kind.MESSAGE, Kind.TOOL]
    assert seen.steps[1]["text"] == 'AskUser {"questionnaire": "q"}'


def test_a_box_tool_is_shown_by_its_box_name() -> None:
    seen = reader().read(
        created("assistant", tool_use("box___wallet__pay", {"cents": 5, "to": "bob"}))
    )
    (step,) = seen.steps
    assert step["text"] == 'wallet.pay {"cents": 5, "to": "bob"}'
    assert step["data"] == {"session": SESSION, "kind": Kind.TOOL, "tool": "wallet.pay"}


def test_the_plan_is_its_own_step() -> None:
    seen = reader().read(created("assistant", tool_use("ExitSpecMode", {"plan": "1. Write a.txt"})))
    (step,) = seen.steps
    assert step["text"] == "Plan:\n1. Write a.txt"
    assert step["data"]["kind"] == Kind.PLAN


def test_a_failed_tool_says_why_by_its_name() -> None:
    notifications = reader()
    notifications.read(created("assistant", tool_use("box___wallet__pay", {"cents": 5})))
    seen = notifications.read(tool_result("Error: not approved", error=True))
    (step,) = seen.steps
    assert step["text"] == "wallet.pay failed: Error: not approved"
    assert step["data"]["kind"] == Kind.TOOL_ERROR


def test_a_tool_that_worked_is_not_a_second_step() -> None:
    assert reader().read(tool_result('{"success":true}', error=False)).steps == ()


def test_the_end_of_the_turn_is_the_summary_with_the_last_words() -> None:
    notifications = reader()
    notifications.read(created("assistant", text("Wrote summary.md")))
    seen = notifications.read(turn_completed())
    assert seen.ended and seen.finished
    (step,) = seen.steps
    assert step["text"] == "Wrote summary.md"
    assert step["data"]["kind"] == Kind.SUMMARY


def test_words_before_the_last_message_are_not_the_summary() -> None:
    notifications = reader()
    notifications.read(created("assistant", text("Looking."), tool_use("Read", {"file": "a"})))
    notifications.read(created("assistant", tool_use("Create", {"file": "b"}, ident="toolu_2")))
    (step,) = notifications.read(turn_completed()).steps
    assert step["text"] == "Droid finished."


def test_a_turn_without_words_still_ends_with_a_summary() -> None:
    (step,) = reader().read(turn_completed()).steps
    assert step["text"] == "Droid finished."


def test_a_turn_that_ended_otherwise_is_an_error() -> None:
    seen = reader().read(turn_completed("model_authentication_failed"))
    assert seen.ended and not seen.finished
    assert seen.error == "Droid's turn ended: model_authentication_failed"
    assert seen.steps == ()


def test_an_error_is_remembered_not_logged() -> None:
    seen = reader().read(
        {
            "type": "error",
            "sessionId": SESSION,
            "message": '401 {"type":"error","error":{"type":"authentication_error"}}',
            "errorType": "Error",
        }
    )
    assert seen.error == '401 {"type":"error","error":{"type":"authentication_error"}}'
    assert seen.steps == ()


def test_progress_and_system_messages_are_not_steps() -> None:
    notifications = reader()
    for notification in (
        {"type": "droid_working_state_changed", "newState": "thinking", "sessionId": SESSION},
        {"type": "assistant_text_delta", "textDelta": "Hel", "blockIndex": 0},
        {"type": "tool_call", "toolUse": tool_use("Create", {})},
        created("system", text("BYOK Error: 401")),
        {"type": "create_message", "message": "not a message"},
    ):
        assert notifications.read(notification) == notifications.read({})


def test_another_sessions_notifications_are_not_this_ones() -> None:
    notifications = reader()
    other = {**turn_completed(), "sessionId": "a-subagents-session"}
    assert notifications.read(other) == notifications.read({})
    unnamed = {**turn_completed()}
    del unnamed["sessionId"]
    assert notifications.read(unnamed).finished


def test_long_text_is_cut_to_what_a_step_holds() -> None:
    (step,) = reader().read(created("assistant", text("x" * 50_000))).steps
    assert len(step["text"]) == MAX_STEP_TEXT


def test_a_refusal_is_a_tool_error_step() -> None:
    step = reader().refusal("Droid needed permission for Execute rm -rf /")
    assert step["text"] == "Refused: Droid needed permission for Execute rm -rf /"
    assert step["data"]["kind"] == Kind.TOOL_ERROR


def test_a_resumed_worker_says_it_carried_on() -> None:
    step = Notifications(SESSION, MODEL).started(resumed=True)
    assert step["text"] == f"Droid carried on where it stopped, on {MODEL}"
    assert step["data"] == {"session": SESSION, "kind": Kind.STARTED}


def test_an_api_error_is_told_in_the_apis_own_words() -> None:
    said = (
        '403 {"type":"error","error":{"type":"permission_error",'
        '"message":"The box owner said no to more model spending."}}'
    )
    seen = reader().read({"type": "error", "sessionId": SESSION, "message": said})
    assert seen.error == "The box owner said no to more model spending."
