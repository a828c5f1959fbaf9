"""The task's autonomy as Claude Code's permissions: what runs unasked, what the owner is asked,
what is refused."""

from boxd.workers.claude.autonomy import (
    allowed_tools,
    disabled_tools,
    permission_mode,
    within,
)


def test_low_edits_the_workspace_and_asks_for_nothing_that_runs() -> None:
    assert permission_mode("low", False) == "acceptEdits"
    assert "Bash" not in allowed_tools("low") and "Write" not in allowed_tools("low")
    assert "mcp__box" in allowed_tools("low") and "Read" in allowed_tools("low")
    # An edit Claude Code asks about (outside the workspace) is the owner's; a command is not.
    assert within("Write", "low") and within("mcp__box__wallet__pay", "low")
    assert not within("Bash", "low") and not within("WebFetch", "low")


def test_medium_runs_commands_and_high_asks_nobody() -> None:
    assert "Bash" in allowed_tools("medium") and within("Bash", "medium")
    assert permission_mode("medium", False) == "acceptEdits"
    assert permission_mode("high", False) == "bypassPermissions"
    assert within("SomethingNew", "high") and not within("SomethingNew", "medium")


def test_work_that_outlives_the_turn_is_never_within() -> None:
    for tool in ("Task", "CronCreate", "ScheduleWakeup", "AskUserQuestion", "EnterPlanMode"):
        assert not within(tool, "high")
        assert tool in disabled_tools(False) and tool in disabled_tools(True)
    assert "ExitPlanMode" in disabled_tools(False) and "ExitPlanMode" not in disabled_tools(True)


def test_a_plan_comes_first_and_an_unknown_level_is_low() -> None:
    assert permission_mode("high", True) == "plan"
    assert allowed_tools("root") == allowed_tools("low")
    assert not within("Bash", "root")
