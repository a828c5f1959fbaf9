"""Claude Code's stream-json output, read as the task's steps.

`claude -p --output-format stream-json --verbose` writes one JSON object a line: `system`
(`init`: the session id, the model, the MCP servers and whether they connected), `assistant`
(a message of the model's, one content block at a time: text, tool_use, thinking), `user` (the
tools' results) and at the end `result` (success or the error, the final text, and the
permission prompts that were denied). Every step carries the session id, so a worker started
again resumes it (`--resume`, boxd.workers.agent_events.last_session).

A planned task's plan is a step when the model hands it in (ExitPlanMode), and its acceptance
another when the tool's result comes back without an error: a worker started again resumes in
plan mode unless that second step is in the log (`plan_accepted`).
"""

from typing import Any

from boxd.workers.agent_config import MCP_SERVER
from boxd.workers.agent_events import (
    Kind,
    Seen,
    api_words,
    as_text,
    cut,
    step,
    tool_use_step,
)
from boxd.workers.claude.autonomy import MCP_PREFIX, PLAN_TOOL, within

# How Claude Code words an API error in its result: "API Error: 403 {...}".
_API_ERROR_PREFIX = "API Error: "


def result_error(text: str) -> str:
    """The API's own words out of "API Error: 403 {...}"; other errors as they are."""
    return api_words(text.strip().removeprefix(_API_ERROR_PREFIX))


class Events:
    """Reads one run's lines as steps. The session id comes with `init`; until then (and for
    lines of a subagent's) nothing is a step."""

    def __init__(self, model: str, autonomy: str, *, resumed: bool) -> None:
        self.session = ""
        self._model = model
        self._autonomy = autonomy
        self._resumed = resumed
        self._tools: dict[str, str] = {}
        # What Claude Code wanted that was beyond the task's autonomy: why the task fails.
        self.refused: list[str] = []

    def _step(self, text: str, kind: str) -> dict[str, Any]:
        return step(text, self.session, kind)

    def read(self, line: dict[str, Any]) -> Seen:
        kind = line.get("type")
        if kind == "system" and line.get("subtype") == "init":
            return self._init(line)
        if not self.session or line.get("parent_tool_use_id"):
            return Seen()
        message = line.get("message")
        if kind == "assistant" and isinstance(message, dict):
            return Seen(tuple(self._assistant(message)))
        if kind == "user" and isinstance(message, dict):
            return Seen(tuple(self._results(message)))
        if kind == "result":
            return self._result(line)
        return Seen()

    def _init(self, line: dict[str, Any]) -> Seen:
        session = as_text(line.get("session_id"))
        if not session:
            return Seen(error="Claude Code started no session")
        self.session = session
        began = "carried on where it stopped" if self._resumed else "started working"
        model = as_text(line.get("model")) or self._model
        steps = [self._step(f"Claude Code {began}, on {model}", Kind.STARTED)]
        servers = line.get("mcp_servers") or []
        if not isinstance(servers, list):
            why = f"its MCP servers came as {type(servers).__name__}, not a list"
            return Seen(tuple(steps), error=f"Claude Code started without its tools: {why}")
        for server in servers:
            if isinstance(server, dict) and server.get("name") == MCP_SERVER:
                status = as_text(server.get("status"))
                if status != "connected":
                    why = f"the box's MCP relay did not connect ({status or 'no status'})"
                    return Seen(tuple(steps), error=f"Claude Code started without its tools: {why}")
        return Seen(tuple(steps))

    def _assistant(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        steps = []
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                text = as_text(block.get("text")).strip()
                if text:
                    steps.append(self._step(text, Kind.MESSAGE))
            elif block.get("type") == "tool_use":
                steps.append(self._tool_use(block))
        return steps

    def _tool_use(self, block: dict[str, Any]) -> dict[str, Any]:
        return tool_use_step(
            block, self.session, self._tools, mcp_prefix=MCP_PREFIX, plan_tool=PLAN_TOOL
        )

    def _results(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        steps = []
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            name = self._tools.get(as_text(block.get("tool_use_id")), "a tool")
            if block.get("is_error") is not True:
                if name == PLAN_TOOL:
                    accepted = "The plan was accepted; the work goes on."
                    steps.append(self._step(accepted, Kind.PLAN_ACCEPTED))
                continue
            said = block.get("content")
            if isinstance(said, list):
                parts = [part for part in said if isinstance(part, dict)]
                said = " ".join(as_text(part.get("text")) for part in parts)
            why = as_text(said).strip() or "no reason given"
            steps.append(self._step(f"{name} failed: {why}", Kind.TOOL_ERROR))
        return steps

    def _result(self, line: dict[str, Any]) -> Seen:
        for denied in line.get("permission_denials") or []:
            if not isinstance(denied, dict):
                continue
            tool = as_text(denied.get("tool_name"))
            if tool and not within(tool, self._autonomy):
                self.refused.append(self._wanted(tool, denied.get("tool_input")))
        text = as_text(line.get("result")).strip()
        if self.refused:
            why = "; ".join(self.refused)
            return Seen((self._step(f"Refused: {why}", Kind.TOOL_ERROR),), error=why, ended=True)
        if line.get("subtype") != "success" or line.get("is_error") is True:
            said = result_error(text) if text else as_text(line.get("subtype"))
            return Seen(error=f"Claude Code stopped: {said or 'no reason given'}", ended=True)
        summary = self._step(text or "Claude Code finished.", Kind.SUMMARY)
        return Seen((summary,), ended=True, finished=True)

    def _wanted(self, tool: str, tool_input: Any) -> str:
        detail: Any = None
        if isinstance(tool_input, dict):
            detail = tool_input.get("command") or tool_input.get("file_path")
        shown = f"{tool} {detail}" if isinstance(detail, str) else tool
        return (
            f"Claude Code needed permission for {cut(shown, 300)}, which autonomy "
            f"{self._autonomy} does not allow; a task with a higher droid.autonomy may do it"
        )


def plan_accepted(steps: list[dict[str, Any]]) -> bool:
    """Whether a task's log holds its plan's acceptance: a planned task whose worker was lost
    before it resumes in plan mode. A step is the task's own word (its worker logs it), and a
    task that forged this one gains nothing it could not have by handing in any plan, which the
    box accepts without asking."""
    for logged in steps:
        data = logged.get("data") if isinstance(logged, dict) else None
        if isinstance(data, dict) and data.get("kind") == Kind.PLAN_ACCEPTED:
            return True
    return False
