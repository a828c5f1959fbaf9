"""Claude Code's stream-json lines (as 2.1.337 writes them) read as steps."""

from typing import Any

from boxd.workers.claude.events import Events, plan_accepted

SESSION = "86ee8b59-0410-47f0-aff3-87aa07a8303e"


def init(status: str = "connected") -> dict[str, Any]:
    return {
        "type": "system",
        "subtype": "init",
        "session_id": SESSION,
        "model": "claude-sonnet-4-5",
        "mcp_servers": [{"name": "box", "status": status}],
    }


def assistant(*blocks: dict[str, Any], parent: str | None = None) -> dict[str, Any]:
    return {
        "type": "assistant",
        "message": {"role": "assistant", "content": list(blocks)},
        "parent_tool_use_id": parent,
        "session_id": SESSION,
    }


def result(**more: Any) -> dict[str, Any]:
    return {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "result": "Done.",
        "permission_denials": [],
        "session_id": SESSION,
        **more,
    }


def test_a_turn_is_started_tools_words_and_summary_each_with_the_session() -> None:
    events = Events("claude-sonnet-4-5", "low", resumed=False)
    steps: list[dict[str, Any]] = []
    for line in (
        init(),
        assistant({"type": "tool_use", "id": "t1", "name": "mcp__box__wallet__pay", "input": {}}),
        {
            "type": "user",
            "message": {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "is_error": True,
                        "content": [{"type": "text", "text": "no money"}],
                    }
                ],
            },
        },
        assistant({"type": "text", "text": "Done."}),
    ):
        steps += events.read(line).steps
    end = events.read(result())
    assert end.ended and end.finished and end.error is None
    steps += end.steps
    assert [(s["data"]["kind"], s["text"]) for s in steps] == [
        ("started", "Claude Code started working, on claude-sonnet-4-5"),
        ("tool", "wallet.pay {}"),
        ("tool-error", "wallet.pay failed: no money"),
        ("message", "Done."),
        ("summary", "Done."),
    ]
    assert {s["data"]["session"] for s in steps} == {SESSION}


def test_a_subagent_s_lines_are_not_the_task_s_steps() -> None:
    events = Events("m", "low", resumed=True)
    assert events.read(init()).steps[0]["text"].startswith("Claude Code carried on")
    assert events.read(assistant({"type": "text", "text": "x"}, parent="t9")).steps == ()


def test_a_relay_that_did_not_connect_is_an_error() -> None:
    seen = Events("m", "low", resumed=False).read(init("failed"))
    assert seen.error is not None and "relay did not connect (failed)" in seen.error


def test_mcp_servers_that_are_not_a_list_are_an_error_in_words() -> None:
    for servers in (5, "box", {"name": "box"}):
        seen = Events("m", "low", resumed=False).read({**init(), "mcp_servers": servers})
        assert seen.error is not None and "not a list" in seen.error


def test_the_gateway_s_refusal_is_the_error_in_its_own_words() -> None:
    events = Events("m", "low", resumed=False)
    events.read(init())
    error = '{"type":"error","error":{"type":"permission_error","message":"over budget"}}'
    said = f"API Error: 403 {error}"
    end = events.read(result(subtype="success", is_error=True, result=said))
    assert end.ended and not end.finished
    assert end.error == "Claude Code stopped: over budget"


def test_a_denial_beyond_the_autonomy_fails_the_task_and_the_owner_s_no_does_not() -> None:
    events = Events("m", "low", resumed=False)
    events.read(init())
    denied = [
        {"tool_name": "Bash", "tool_use_id": "a", "tool_input": {"command": "rm -rf x"}},
        {"tool_name": "Write", "tool_use_id": "b", "tool_input": {"file_path": "/etc/x"}},
    ]
    end = events.read(result(permission_denials=denied))
    assert end.ended and not end.finished
    assert end.error == (
        "Claude Code needed permission for Bash rm -rf x, which autonomy low does not allow; "
        "a task with a higher droid.autonomy may do it"
    )
    assert end.steps[0]["data"]["kind"] == "tool-error"
    owner_said_no = Events("m", "low", resumed=False)
    owner_said_no.read(init())
    assert owner_said_no.read(result(permission_denials=denied[1:])).finished


def plan_result(tool_use_id: str, *, error: bool) -> dict[str, Any]:
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": "User has approved exiting plan mode. You can now proceed.",
    }
    if error:
        block |= {"is_error": True, "content": "The box refused ExitPlanMode"}
    return {"type": "user", "message": {"role": "user", "content": [block]}}


def steps_of(*lines: dict[str, Any]) -> list[dict[str, Any]]:
    """The steps one run at low autonomy makes of its `init` and then `lines`."""
    events = Events("claude-sonnet-4-5", "low", resumed=False)
    return [step for line in (init(), *lines) for step in events.read(line).steps]


def hands_in_a_plan(tool_use_id: str) -> dict[str, Any]:
    return assistant(
        {"type": "tool_use", "id": tool_use_id, "name": "ExitPlanMode", "input": {"plan": "1."}}
    )


def test_a_plan_is_a_step_and_its_acceptance_another() -> None:
    steps = steps_of(
        hands_in_a_plan("p1"),
        plan_result("p1", error=False),
        # Another tool's result without an error is no step.
        assistant({"type": "tool_use", "id": "r1", "name": "Read", "input": {}}),
        plan_result("r1", error=False),
    )
    assert [s["data"]["kind"] for s in steps] == ["started", "plan", "plan-accepted", "tool"]
    assert steps[1]["text"] == "Plan:\n1."
    assert {s["data"]["session"] for s in steps} == {SESSION}
    assert plan_accepted(steps)


def test_a_refused_plan_is_no_acceptance() -> None:
    steps = steps_of(hands_in_a_plan("p1"), plan_result("p1", error=True))
    assert [s["data"]["kind"] for s in steps] == ["started", "plan", "tool-error"]
    assert not plan_accepted(steps)


def test_only_an_acceptance_step_means_the_plan_was_accepted() -> None:
    plan = {"text": "Plan:\n1.", "data": {"session": SESSION, "kind": "plan"}}
    accepted = {"text": "accepted", "data": {"session": SESSION, "kind": "plan-accepted"}}
    assert not plan_accepted([])
    # Handed in, and the worker lost before the answer came back.
    assert not plan_accepted([plan])
    assert plan_accepted([plan, accepted])
    # Steps of another shape (the fake worker's, a step without data) are read past.
    assert not plan_accepted([{"text": "x"}, {"text": "y", "data": "plan-accepted"}])
    assert plan_accepted([{"text": "x"}, plan, accepted])
