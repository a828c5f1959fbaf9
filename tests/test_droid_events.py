"""Droid's stream-json events, as Droid 0.225.2 printed them against a scripted model."""

from typing import Any

from boxd.caps import MAX_STEP_TEXT
from boxd.workers.droid_events import Kind, api_words, last_session, read_event, tool_name

SESSION = "66baa155-cf69-4315-8582-e50550434584"
MODEL = "claude-sonnet-4-6"


def event(**fields: Any) -> dict[str, Any]:
    return {"session_id": SESSION, "timestamp": 1796280068038, **fields}


def test_init_is_the_first_step_and_names_the_session() -> None:
    seen = read_event(event(type="system", subtype="init", cwd="/w", tools=["Read"]), MODEL)
    assert seen.step == {
        "text": f"Droid started working, on {MODEL}",
        "data": {"session": SESSION, "kind": Kind.STARTED},
    }


def test_the_users_prompt_is_not_a_step() -> None:
    assert read_event(event(type="message", role="user", text="pay bob"), MODEL).step is None


def test_an_assistant_message_is_a_step() -> None:
    seen = read_event(event(type="message", role="assistant", text="Paying bob now."), MODEL)
    assert seen.step == {
        "text": "Paying bob now.",
        "data": {"session": SESSION, "kind": Kind.MESSAGE},
    }


def test_a_box_tool_is_shown_by_its_box_name() -> None:
    seen = read_event(
        event(
            type="tool_call",
            toolId="box___wallet__pay",
            toolName="box___wallet__pay",
            parameters={"cents": 5, "to": "bob"},
        ),
        MODEL,
    )
    assert seen.step is not None
    assert seen.step["text"] == 'wallet.pay {"cents": 5, "to": "bob"}'
    assert seen.step["data"] == {"session": SESSION, "kind": Kind.TOOL, "tool": "wallet.pay"}


def test_the_plan_is_its_own_step() -> None:
    seen = read_event(
        event(type="tool_call", toolName="ExitSpecMode", parameters={"plan": "1. Write a.txt"}),
        MODEL,
    )
    assert seen.step is not None
    assert seen.step["text"] == "Plan:\n1. Write a.txt"
    assert seen.step["data"]["kind"] == Kind.PLAN


def test_a_failed_tool_says_why() -> None:
    seen = read_event(
        event(
            type="tool_result",
            toolId="box___wallet__pay",
            isError=True,
            error={"type": "tool_error", "message": "Error: not approved"},
        ),
        MODEL,
    )
    assert seen.step is not None
    assert seen.step["text"] == "wallet.pay failed: Error: not approved"


def test_a_tool_that_worked_is_not_a_second_step() -> None:
    seen = read_event(event(type="tool_result", toolId="Create", isError=False, value="{}"), MODEL)
    assert seen.step is None


def test_completion_is_the_summary_and_the_end() -> None:
    seen = read_event(event(type="completion", finalText="Wrote summary.md", numTurns=3), MODEL)
    assert seen.finished
    assert seen.step is not None
    assert seen.step["text"] == "Wrote summary.md"
    assert seen.step["data"]["kind"] == Kind.SUMMARY


def test_an_error_is_remembered_not_logged() -> None:
    seen = read_event(event(type="error", source="cli", message="insufficient permission"), MODEL)
    assert seen.error == "insufficient permission"
    assert seen.step is None


def test_long_text_is_cut_to_what_a_step_holds() -> None:
    seen = read_event(event(type="message", role="assistant", text="x" * 50_000), MODEL)
    assert seen.step is not None
    assert len(seen.step["text"]) == MAX_STEP_TEXT


def test_events_without_a_session_or_not_objects_are_ignored() -> None:
    assert read_event({"type": "message", "role": "assistant", "text": "hi"}, MODEL).step is None
    assert read_event(["not", "an", "event"], MODEL).step is None


def test_tool_names() -> None:
    assert tool_name("box___mail__send") == "mail.send"
    assert tool_name("box___box_ask") == "box_ask"
    assert tool_name("Create") == "Create"


def test_resume_forks_the_newest_session_a_step_names() -> None:
    steps = [
        {"text": "one", "data": {"session": "aaa-1", "kind": "message"}},
        {"text": "two", "data": {"session": "bbb-2", "kind": "tool"}},
        {"text": "a fake line", "data": {"line": 3}},
    ]
    assert last_session(steps) == "bbb-2"
    assert last_session([]) is None


def test_a_session_that_is_not_an_id_is_never_forked() -> None:
    """A step could hold anything the task logged: nothing that reads as a flag reaches argv."""
    steps = [{"text": "x", "data": {"session": "--skip-permissions-unsafe"}}]
    assert last_session(steps) is None


def test_a_resumed_worker_says_it_carried_on() -> None:
    seen = read_event(event(type="system", subtype="init"), MODEL, resumed=True)
    assert seen.step is not None
    assert seen.step["text"] == f"Droid carried on where it stopped, on {MODEL}"


def test_an_api_error_is_told_in_the_apis_own_words() -> None:
    said = (
        '403 {"type":"error","error":{"type":"permission_error",'
        '"message":"The box owner said no to more model spending."}}'
    )
    seen = read_event(event(type="error", source="agent_loop", message=said), MODEL)
    assert seen.error == "The box owner said no to more model spending."
    assert api_words("403 {not json}") == "403 {not json}"
    assert api_words("Exec failed") == "Exec failed"
