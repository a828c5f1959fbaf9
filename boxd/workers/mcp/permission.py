"""The relay's `box_permission`: Claude Code's permission prompts (`--permission-prompt-tool
mcp__box__box_permission`), answered as the task's autonomy says (boxd.workers.claude.autonomy).

A prompt for what the autonomy covers becomes the owner's approval, `POST /ask` with key
`claude.permission.<hash of the tool and its whole input>`: the same request is the same
approval, also after a restart, and a pending one is asked again with the same key until the
owner answers. The question shows the whole input (a Write's content, an Edit's old and new
text, the whole command), so what the owner approves is exactly what runs; an input too long to
show in one question is refused, never cut. A prompt
for more than the autonomy is refused without asking anyone; the worker reads the refusal in
Claude Code's result and fails the task with it, as Droid's worker does.

The answer is the JSON Claude Code reads from the tool's text: `{"behavior": "allow",
"updatedInput": ...}` or `{"behavior": "deny", "message": ...}`.
"""

import json
import logging
from typing import Any

from boxd.reading.canonical_json import input_hash
from boxd.wire.approval import MAX_QUESTION
from boxd.workers.claude.autonomy import (
    PERMISSION_TOOL,
    PLAN_TOOL,
    level,
    permission_mode,
    within,
)
from boxd.workers.mcp.tools import Broker, text_result
from boxd.workers.unix_http import BROKER_FAILURES

# The relay's environment, from the Claude worker's MCP configuration (on Claude Code's command
# line, which the agent cannot change): the task's autonomy, and whether it plans first.
AUTONOMY_VARIABLE = "BOX_CLAUDE_AUTONOMY"
PLAN_VARIABLE = "BOX_CLAUDE_PLAN"
log = logging.getLogger("boxd.workers.mcp.permission")

PERMISSION_TOOL_SPEC = {
    "name": PERMISSION_TOOL,
    "description": (
        "Claude Code's permission prompts, answered by the box: within the task's autonomy by "
        "the box owner, beyond it refused. Not for the model to call."
    ),
    "inputSchema": {
        "type": "object",
        "properties": {
            "tool_name": {"type": "string"},
            "input": {"type": "object"},
            "tool_use_id": {"type": "string"},
        },
        "required": ["tool_name", "input"],
    },
}


def question(tool: str, tool_input: Any) -> str | None:
    """The whole request as the owner reads it, or None when it does not fit in one question."""
    shown = json.dumps(tool_input, ensure_ascii=False, sort_keys=True, indent=1)
    text = f"Claude Code asks to use {tool} with this input:\n{shown}"
    return text if len(text) <= MAX_QUESTION else None


def permission_key(tool: str, tool_input: Any) -> str:
    """One approval per tool and complete input: the same request finds the same answer."""
    return f"claude.permission.{input_hash({'tool': tool, 'input': tool_input})}"


def too_long(tool: str) -> str:
    return (
        f"The box refused {tool} without asking: its input is too long to show the box owner "
        f"in one question (over {MAX_QUESTION} characters), and the owner approves only what "
        "they can read whole. Split the work into smaller steps."
    )


def beyond(tool: str, autonomy: str) -> str:
    """The refusal Claude Code reads, and the worker finds in its result."""
    return (
        f"{tool} needs more than this task's autonomy ({level(autonomy)}) allows, so the box "
        "refused it without asking. A task with a higher droid.autonomy may do it."
    )


def _decision(
    allow: bool, tool_input: Any, message: str = "", mode: str | None = None
) -> dict[str, Any]:
    if allow:
        answer: dict[str, Any] = {"behavior": "allow", "updatedInput": tool_input}
        if mode is not None:
            answer["updatedPermissions"] = [
                {"type": "setMode", "mode": mode, "destination": "session"}
            ]
    else:
        answer = {"behavior": "deny", "message": message}
    return text_result(json.dumps(answer, ensure_ascii=False))


class Permissions:
    spec = PERMISSION_TOOL_SPEC

    def __init__(self, broker: Broker, *, autonomy: str, plan: bool) -> None:
        self._broker = broker
        self.autonomy = level(autonomy)
        self.plan = plan

    async def answer(self, arguments: dict[str, Any]) -> dict[str, Any]:
        tool = arguments.get("tool_name")
        tool_input = arguments.get("input")
        if not isinstance(tool, str) or not isinstance(tool_input, dict):
            return text_result(
                f"{PERMISSION_TOOL} needs tool_name, a string, and input, an object", error=True
            )
        if tool == PLAN_TOOL:
            # The plan the task asked for: accepted, and the work goes on at its autonomy
            # (out of plan mode Claude Code would otherwise ask before every edit).
            if self.plan:
                return _decision(True, tool_input, mode=permission_mode(self.autonomy, False))
            return _decision(False, tool_input, beyond(tool, self.autonomy))
        if not within(tool, self.autonomy):
            return _decision(False, tool_input, beyond(tool, self.autonomy))
        return await self._ask_owner(tool, tool_input)

    async def _ask_owner(self, tool: str, tool_input: dict[str, Any]) -> dict[str, Any]:
        text = question(tool, tool_input)
        if text is None:
            log.warning(
                "refused %s without asking: its input is over %d characters", tool, MAX_QUESTION
            )
            return _decision(False, tool_input, too_long(tool))
        body = {"question": text, "key": permission_key(tool, tool_input)}
        while True:
            try:
                answer = await self._broker("POST", "/ask", body)
            except BROKER_FAILURES as failure:
                return _decision(False, tool_input, f"The box could not ask its owner: {failure}")
            if isinstance(answer, dict) and answer.get("approved") is True:
                return _decision(True, tool_input)
            if isinstance(answer, dict) and answer.get("approved") is False:
                return _decision(False, tool_input, "The box owner did not approve this.")
            if not (isinstance(answer, dict) and answer.get("pending") is True):
                said = json.dumps(answer)[:200]
                return _decision(False, tool_input, f"The broker answered /ask with {said}")
            # Pending: the broker waited BOX_APPROVAL_WAIT_MS; the same key waits on.
