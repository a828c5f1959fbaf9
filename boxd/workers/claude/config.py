"""The command that runs Claude Code for a task, and its environment.

Claude Code runs headless (`-p`, stream-json out, the prompt on stdin) in the workspace view,
with its model at the task's model gateway (ANTHROPIC_BASE_URL = BOX_MODEL_URL) and a
placeholder key the gateway throws away, so the real key never enters the sandbox. Its state
(sessions, ~/.claude.json) lives in the task's own HOME, never in the workspace that tasks share.

It loads no settings file at all (`--setting-sources ""`): not the workspace's
`.claude/settings.json` and hooks, which another task may have written and which are this
task's input, not the box's configuration; and not the task's HOME either, which Claude Code
itself can write, so it could not raise its own permissions by writing its settings. What the
box sets is on the command line, which it cannot change: the tools its autonomy allows
(boxd.workers.claude.autonomy), the box's relay as its one MCP server (`--strict-mcp-config`),
and that relay's `box_permission` for its permission prompts. With no setting sources a
CLAUDE.md in the workspace is not read either, and auto memory is off
(CLAUDE_CODE_DISABLE_AUTO_MEMORY): only the task's prompt tells Claude Code what to do.
"""

import json
from pathlib import Path
from typing import Any

from boxd.workers.agent_config import MCP_SERVER, PLACEHOLDER_KEY, relay_server
from boxd.workers.claude.autonomy import (
    MCP_PREFIX,
    PERMISSION_TOOL,
    allowed_tools,
    disabled_tools,
    level,
    permission_mode,
)
from boxd.workers.mcp.permission import (
    AUTONOMY_VARIABLE,
    HOME_VARIABLE,
    PLAN_VARIABLE,
    WORK_VARIABLE,
)


def environment(own_home: Path, gateway_url: str) -> dict[str, str]:
    """Added to the worker's own environment (BOX_*, the proxies, HOME) for Claude Code."""
    return {
        "ANTHROPIC_BASE_URL": gateway_url,
        "ANTHROPIC_API_KEY": PLACEHOLDER_KEY,
        # No auto-updates, telemetry, error reports or other calls home: the allowlist would
        # refuse them anyway, and each refusal is logged for the owner.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CONFIG_DIR": str(own_home / ".claude"),
        # Only the betas Claude Code needs (claude-code, interleaved thinking, effort), which the
        # gateway passes; its experimental ones (thinking-token-count, thinking-display-updates,
        # advanced-tool-use) are not on the gateway's allowlist and would be refused.
        "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1",
        # The box's few tools offered to the model as tools, not deferred behind ToolSearch
        # (Claude Code 2's default), where a direct call of box_ask fails until it is searched.
        "ENABLE_TOOL_SEARCH": "false",
        # No auto memory: $CLAUDE_CONFIG_DIR/projects/<cwd>/memory/MEMORY.md reaches the system
        # prompt whatever --setting-sources says, and Claude Code writes it itself, so one turn
        # could leave instructions for every later task in the same workspace.
        "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
        # The workspace's .git/config is input another task may have written, and at low
        # autonomy Claude Code runs `git status` and the like without asking: no fsmonitor
        # command and no hooks from it (these override every config file).
        # What guards the rest of .git/config (filters, diff drivers, textconv) is git's own
        # ownership check: the workspace's files belong to the task that wrote them, a uid no
        # later task has, and git refuses a repository another user owns ("dubious
        # ownership"); no safe.directory is ever set (tests/vm/test_task_leftovers.py).
        **git_overrides(),
    }


# Set on git's command line in effect (GIT_CONFIG_COUNT), over every config file.
GIT_OVERRIDES = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    # No repository found by its layout alone in a folder another task wrote, and no
    # `ext::` remote that runs a command.
    ("safe.bareRepository", "explicit"),
    ("protocol.ext.allow", "never"),
)


def git_overrides() -> dict[str, str]:
    variables = {"GIT_CONFIG_COUNT": str(len(GIT_OVERRIDES))}
    for index, (key, value) in enumerate(GIT_OVERRIDES):
        variables[f"GIT_CONFIG_KEY_{index}"] = key
        variables[f"GIT_CONFIG_VALUE_{index}"] = value
    return variables


def mcp_config(
    python: str, socket: str, autonomy: str, plan: bool, *, home: Path, work: Path
) -> dict[str, Any]:
    """The box's relay, started by Claude Code over stdio. It holds no secrets; it reaches only
    the task's broker, and answers permission prompts as the task's autonomy says (it refuses
    edits in the task's `home`, and resolves them from `work`, the workspace view)."""
    told = {
        AUTONOMY_VARIABLE: level(autonomy),
        PLAN_VARIABLE: "1" if plan else "0",
        HOME_VARIABLE: str(home),
        WORK_VARIABLE: str(work),
    }
    return {"mcpServers": {MCP_SERVER: relay_server(python, socket, told)}}


def command(
    claude: Path,
    *,
    model: str,
    autonomy: str,
    plan: bool,
    mcp: dict[str, Any],
    resume: str | None,
) -> list[str]:
    """`claude -p`, its prompt read from stdin (a prompt may be longer than one argument)."""
    arguments = [
        str(claude),
        "-p",
        "--output-format",
        "stream-json",
        # stream-json with -p needs --verbose; it adds no text of its own to the stream.
        "--verbose",
        "--model",
        model,
        "--setting-sources",
        "",
        # A prompt that starts with "/" is the task's words, not a command or a skill to run
        # (tasks come from apps, schedules and other systems too).
        "--disable-slash-commands",
        "--strict-mcp-config",
        "--mcp-config",
        json.dumps(mcp),
        "--permission-mode",
        permission_mode(autonomy, plan),
        "--permission-prompt-tool",
        f"{MCP_PREFIX}{PERMISSION_TOOL}",
        "--allowedTools",
        ",".join(allowed_tools(autonomy)),
        "--disallowedTools",
        ",".join(disabled_tools(plan)),
    ]
    if resume is not None:
        arguments += ["--resume", resume]
    return arguments
