"""The relay's `box_permission`: Claude Code's permission prompts (`--permission-prompt-tool
mcp__box__box_permission`), answered as the task's autonomy says (boxd.workers.claude.autonomy).

A prompt for what the autonomy covers becomes the owner's approval, `POST /ask` with key
`claude.permission.<hash of the tool, its whole input and where it writes>.<n>`, n counting the
answers this relay already had for that request: a pending one is asked again with the same key
until the owner answers, the request made again later is asked again, and a relay started again
after a restart finds the answers it had before under the same keys. The question shows the
whole input (a Write's content, an Edit's old and new text, the whole command) and, for an edit,
the file it really writes, links followed, so what the owner approves is what runs; an input
too long to show in one question is refused, never cut.

A prompt for more than the autonomy is refused without asking anyone, and so is an edit of a
file in the task's own home: its shell reads `.bashrc` before every command (the read-only ones
low autonomy runs without asking included), git reads `.gitconfig`, and Claude Code its
session's hooks, so a file written there is configuration that runs code, not work. The worker
reads the refusal in Claude Code's result and fails the task with it, as Droid's worker does.

The answer is the JSON Claude Code reads from the tool's text: `{"behavior": "allow",
"updatedInput": ...}` or `{"behavior": "deny", "message": ...}`.
"""

import asyncio
import json
import logging
import os
from collections import Counter
from pathlib import Path
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
# Where the task's own home and its workspace view are, to see where an edit really writes.
HOME_VARIABLE = "BOX_CLAUDE_HOME"
WORK_VARIABLE = "BOX_CLAUDE_WORK"
# Claude Code's tools that write a file, and the input field that names it.
EDIT_PATHS = {
    "Write": "file_path",
    "Edit": "file_path",
    "MultiEdit": "file_path",
    "NotebookEdit": "notebook_path",
}
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


def question(tool: str, tool_input: Any, writes: str | None = None) -> str | None:
    """The whole request as the owner reads it, or None when it does not fit in one question.
    `writes`: the file an edit really writes, when its path says otherwise (a link on the way)."""
    shown = json.dumps(tool_input, ensure_ascii=False, sort_keys=True, indent=1)
    text = f"Claude Code asks to use {tool} with this input:\n{shown}"
    if writes is not None:
        text += f"\nThat path leads through a link: the file it writes is {writes}"
    return text if len(text) <= MAX_QUESTION else None


def permission_key(tool: str, tool_input: Any, writes: str | None = None, count: int = 0) -> str:
    """One approval per tool, complete input and real file, and per time it is asked."""
    request = {"tool": tool, "input": tool_input, "writes": writes}
    return f"claude.permission.{input_hash(request)}.{count}"


def edited_file(tool: str, tool_input: dict[str, Any], work: Path) -> str | None:
    """The file an edit tool would write, links followed (relative to the workspace view, as
    Claude Code reads it), or None for a tool that names no file."""
    field = EDIT_PATHS.get(tool)
    path = tool_input.get(field) if field is not None else None
    if not isinstance(path, str) or not path:
        return None
    return os.path.realpath(work / path)


def within_folder(path: str, folder: Path) -> bool:
    return os.path.commonpath([path, str(folder)]) == str(folder)


def in_home(tool: str, path: str) -> str:
    return (
        f"{tool} of {path} would write in the task's own home, where its shell, git and Claude "
        "Code read configuration that runs commands, so the box refused it without asking. "
        "Write the task's work in its workspace."
    )


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

    def __init__(
        self, broker: Broker, *, autonomy: str, plan: bool, home: Path, work: Path
    ) -> None:
        self._broker = broker
        self.autonomy = level(autonomy)
        self.plan = plan
        self._home = Path(os.path.realpath(home))
        self._work = work
        # Final answers had per request key (without its count) in this relay's life.
        self._answered: Counter[str] = Counter()

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
        writes = await asyncio.to_thread(edited_file, tool, tool_input, self._work)
        if writes is not None and within_folder(writes, self._home):
            log.warning("refused %s without asking: it writes %s, in the task's home", tool, writes)
            return _decision(False, tool_input, in_home(tool, writes))
        path = tool_input.get(EDIT_PATHS.get(tool, ""))
        shown = writes if writes is not None and writes != path else None
        return await self._ask_owner(tool, tool_input, shown)

    async def _ask_owner(
        self, tool: str, tool_input: dict[str, Any], writes: str | None
    ) -> dict[str, Any]:
        text = question(tool, tool_input, writes)
        if text is None:
            log.warning(
                "refused %s without asking: its input is over %d characters", tool, MAX_QUESTION
            )
            return _decision(False, tool_input, too_long(tool))
        request = permission_key(tool, tool_input, writes)
        body = {
            "question": text,
            "key": permission_key(tool, tool_input, writes, self._answered[request]),
        }
        while True:
            try:
                answer = await self._broker("POST", "/ask", body)
            except BROKER_FAILURES as failure:
                return _decision(False, tool_input, f"The box could not ask its owner: {failure}")
            if isinstance(answer, dict) and answer.get("approved") is True:
                self._answered[request] += 1
                return _decision(True, tool_input)
            if isinstance(answer, dict) and answer.get("approved") is False:
                self._answered[request] += 1
                return _decision(False, tool_input, "The box owner did not approve this.")
            if not (isinstance(answer, dict) and answer.get("pending") is True):
                said = json.dumps(answer)[:200]
                return _decision(False, tool_input, f"The broker answered /ask with {said}")
            # Pending: the broker waited BOX_APPROVAL_WAIT_MS; the same key waits on.
