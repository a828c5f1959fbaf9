"""What the Droid and Claude Code workers share in reading their agent's events as steps
(boxd.workers.agent_events); each agent's own reading is tested beside its worker."""

import pytest

from boxd.reading.caps import MAX_STEP_TEXT
from boxd.workers.agent_events import (
    MAX_SHOWN_INPUT,
    Kind,
    api_words,
    last_session,
    step,
    tool_name,
    tool_use_step,
)
from boxd.workers.claude.autonomy import MCP_PREFIX as CLAUDE_PREFIX
from boxd.workers.droid.config import MCP_PREFIX as DROID_PREFIX


@pytest.mark.parametrize("prefix", [DROID_PREFIX, CLAUDE_PREFIX])
def test_the_box_s_tools_go_by_their_own_names(prefix: str) -> None:
    assert tool_name(f"{prefix}mail__send", prefix) == "mail.send"
    assert tool_name(f"{prefix}box_ask", prefix) == "box_ask"
    assert tool_name("Create", prefix) == "Create"


def test_a_step_carries_its_session_and_kind_and_is_cut_to_what_a_step_holds() -> None:
    assert step("", "s1", Kind.SUMMARY) == {
        "text": Kind.SUMMARY,
        "data": {"session": "s1", "kind": Kind.SUMMARY},
    }
    long = step("x" * 50_000, "s1", Kind.MESSAGE)["text"]
    assert len(long) == MAX_STEP_TEXT and long.endswith("…")


def test_a_tool_use_is_shown_by_name_and_cut_input_and_learned_for_its_result() -> None:
    tools: dict[str, str] = {}
    block = {"type": "tool_use", "id": "u1", "name": "mcp__box__wallet__pay"}
    shown = tool_use_step(
        {**block, "input": {"memo": "y" * 1000}},
        "s1",
        tools,
        mcp_prefix=CLAUDE_PREFIX,
        plan_tool="ExitPlanMode",
    )
    assert shown["data"] == {"session": "s1", "kind": Kind.TOOL, "tool": "wallet.pay"}
    assert len(shown["text"]) == len("wallet.pay ") + MAX_SHOWN_INPUT
    assert tools == {"u1": "wallet.pay"}


def test_the_plan_tool_s_use_is_the_plan() -> None:
    block = {"type": "tool_use", "id": "u2", "name": "ExitSpecMode", "input": {"plan": " a\nb "}}
    plan = tool_use_step(block, "s1", {}, mcp_prefix=DROID_PREFIX, plan_tool="ExitSpecMode")
    assert plan == {"text": "Plan:\na\nb", "data": {"session": "s1", "kind": Kind.PLAN}}


def test_resume_carries_on_the_newest_session_a_step_names() -> None:
    steps = [
        {"text": "one", "data": {"session": "aaa-1", "kind": "message"}},
        {"text": "two", "data": {"session": "bbb-2", "kind": "tool"}},
        {"text": "a fake line", "data": {"line": 3}},
    ]
    assert last_session(steps) == "bbb-2"
    assert last_session([]) is None


def test_a_session_that_is_not_an_id_is_never_carried_on() -> None:
    """A step could hold anything the task logged: only an id is sent back to the agent."""
    steps = [{"text": "x", "data": {"session": "--skip-permissions-unsafe"}}]
    assert last_session(steps) is None


def test_an_api_error_is_told_in_the_apis_own_words() -> None:
    said = (
        '403 {"type":"error","error":{"type":"permission_error",'
        '"message":"The box owner said no to more model spending."}}'
    )
    assert api_words(said) == "The box owner said no to more model spending."
    assert api_words("403 {not json}") == "403 {not json}"
    assert api_words('403 {"error": "no message"}') == '403 {"error": "no message"}'
    assert api_words("Exec failed") == "Exec failed"
