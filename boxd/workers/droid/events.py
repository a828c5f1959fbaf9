"""Droid's session notifications, read as steps.

Every step carries the session id in its data, so a worker started again loads the newest
session and carries on (see worker.py); what reading them shares with Claude Code's events is in
boxd.workers.agent_events.
"""

from typing import Any

from boxd.workers.agent_events import Kind, Seen, api_words, as_text, step, tool_use_step
from boxd.workers.droid.config import MCP_PREFIX

PLAN_TOOL = "ExitSpecMode"


class Notifications:
    """Reads one session's notifications (boxd.workers.droid.rpc) as steps.

    Droid announces each message it adds to the session (`create_message`: the assistant's text
    and tool uses, complete), each tool's result (`tool_result`), errors (`error`) and the end of
    the turn (`agent_turn_completed`, with its reason). Steps are made from these, not from the
    streamed deltas and early `tool_call`s, which come before a tool's input is complete.
    """

    def __init__(self, session: str, model: str) -> None:
        self.session = session
        self._model = model
        self._tools: dict[str, str] = {}
        self._last_text = ""

    def started(self, *, resumed: bool) -> dict[str, Any]:
        began = "carried on where it stopped" if resumed else "started working"
        return step(f"Droid {began}, on {self._model}", self.session, Kind.STARTED)

    def refusal(self, why: str) -> dict[str, Any]:
        """The step for what the worker refused Droid (boxd.workers.droid.answers)."""
        return step(f"Refused: {why}", self.session, Kind.TOOL_ERROR)

    def read(self, notification: dict[str, Any]) -> Seen:
        if notification.get("sessionId") not in (None, self.session):
            # A subagent's session (Droid's Task tool): its turn ending is not this one's.
            return Seen()
        kind = notification.get("type")
        if kind == "create_message":
            return self._message(notification.get("message"))
        if kind == "tool_result" and notification.get("isError") is True:
            name = self._tools.get(as_text(notification.get("toolUseId")), "a tool")
            why = as_text(notification.get("content")).strip() or "no reason given"
            return Seen((step(f"{name} failed: {why}", self.session, Kind.TOOL_ERROR),))
        if kind == "error":
            said = api_words(as_text(notification.get("message")))
            return Seen(error=said or "Droid stopped with an error")
        if kind == "agent_turn_completed":
            reason = as_text(notification.get("reason"))
            if reason != "completed":
                why = f"Droid's turn ended: {reason or 'no reason given'}"
                return Seen(error=why, ended=True)
            text = self._last_text or "Droid finished."
            return Seen((step(text, self.session, Kind.SUMMARY),), ended=True, finished=True)
        return Seen()

    def _message(self, message: Any) -> Seen:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            return Seen()
        content = message.get("content")
        steps = []
        # The summary is the newest message's words, as `droid exec`'s final text.
        self._last_text = ""
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                text = as_text(block.get("text")).strip()
                if text:
                    self._last_text = text
                    steps.append(step(text, self.session, Kind.MESSAGE))
            elif block.get("type") == "tool_use":
                steps.append(self._tool_use(block))
        return Seen(tuple(steps))

    def _tool_use(self, block: dict[str, Any]) -> dict[str, Any]:
        return tool_use_step(
            block, self.session, self._tools, mcp_prefix=MCP_PREFIX, plan_tool=PLAN_TOOL
        )
