"""What a task's autonomy (`droid.autonomy` in docs/spec/start-a-task.txt) lets Claude Code do,
as Droid's `--auto` levels say for Droid (docs/agents.md, "Claude Code's autonomy").

- low: read, and edit files (permission mode acceptEdits). Claude Code runs the shell commands
  it judges read-only without asking; any other command is a permission prompt, refused as more
  than the autonomy allows, and the task fails saying what it wanted, as Droid's does.
- medium: also shell commands and web fetches, without asking. What Claude Code still asks
  about (an edit outside the workspace, a protected file, a command it finds dangerous) goes to
  the box owner as an approval.
- high: everything, asking nobody (permission mode bypassPermissions), as `--auto high`.

At every level the box's own tools (the relay, `mcp__box__*`) run without a prompt: the broker
holds them to the task's budget and asks the owner first wherever the autonomy says to. Tools
whose work outlives the worker's one turn (scheduled, background, other sessions) are off, as
Droid's Task and Loop are.
"""

from boxd.workers.agent_config import MCP_SERVER

LEVELS = ("low", "medium", "high")
# The box's MCP server as Claude Code names its tools: `mcp__box__<tool>`.
MCP_PREFIX = f"mcp__{MCP_SERVER}__"
# The relay's tool that answers Claude Code's permission prompts (--permission-prompt-tool).
PERMISSION_TOOL = "box_permission"

READ_TOOLS = (
    "Read",
    "Glob",
    "Grep",
    "LS",
    "NotebookRead",
    "TodoWrite",
    "TaskCreate",
    "TaskGet",
    "TaskList",
    "TaskUpdate",
    "ToolSearch",
    "Skill",
    "ReportFindings",
)
EDIT_TOOLS = ("Edit", "MultiEdit", "Write", "NotebookEdit")
RUN_TOOLS = ("Bash", "BashOutput", "KillShell", "WebFetch", "WebSearch")
# Work that outlives the turn, or leaves the task: subagents and agents in the background,
# schedules and wake-ups, messages to other sessions, worktrees outside the workspace view.
DISABLED_TOOLS = (
    "Task",
    "Agent",
    "TaskStop",
    "TaskOutput",
    "CronCreate",
    "CronDelete",
    "CronList",
    "ScheduleWakeup",
    "Monitor",
    "SendMessage",
    "ListAgents",
    "Workflow",
    "RemoteTrigger",
    "EnterWorktree",
    "ExitWorktree",
)
PLAN_TOOL = "ExitPlanMode"
# Claude Code's own question to its user, whose answers are free text or a choice: the box owner
# answers only yes or no, which the model asks with box_ask. And plan mode, which the task's
# `droid.plan` chooses, not the model.
UNANSWERED_TOOLS = ("AskUserQuestion", "EnterPlanMode")


def disabled_tools(plan: bool) -> list[str]:
    """Never offered to the model (--disallowedTools); ExitPlanMode only to a task that plans."""
    return [*DISABLED_TOOLS, *UNANSWERED_TOOLS, *(() if plan else (PLAN_TOOL,))]


def level(autonomy: str) -> str:
    return autonomy if autonomy in LEVELS else "low"


def allowed_tools(autonomy: str) -> list[str]:
    """Run without a prompt (--allowedTools). Not the edit tools: acceptEdits lets them edit
    the workspace without a prompt, and an edit elsewhere is a prompt for the owner."""
    allowed = [*READ_TOOLS, f"mcp__{MCP_SERVER}"]
    if level(autonomy) != "low":
        allowed += RUN_TOOLS
    return allowed


def permission_mode(autonomy: str, plan: bool) -> str:
    if plan:
        # The plan first; once the owner's box accepts it (the permission tool allows
        # ExitPlanMode), Claude Code carries on under the allowed tools above.
        return "plan"
    return "bypassPermissions" if level(autonomy) == "high" else "acceptEdits"


def within(tool: str, autonomy: str) -> bool:
    """Whether a prompt for `tool` is the owner's to answer (True) or more than the autonomy
    allows (False, refused without asking)."""
    if tool in DISABLED_TOOLS or tool in UNANSWERED_TOOLS:
        return False
    if tool.startswith(MCP_PREFIX) or tool in READ_TOOLS or tool in EDIT_TOOLS:
        return True
    return (level(autonomy) != "low" and tool in RUN_TOOLS) or level(autonomy) == "high"
