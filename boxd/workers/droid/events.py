"""Droid's session notifications, read as steps.

Every step carries the session id in its data, so a worker started again loads the newest
session and carries on (see worker.py).
"""

import json
import re
from dataclasses import dataclass
from typing import Any

from boxd.reading.caps import MAX_STEP_TEXT
from boxd.workers.droid.config import MCP_PREFIX

# What a tool step shows of the tool's input; the owner reads steps, not transcripts.
MAX_SHOWN_INPUT = 500
PLAN_TOOL = "ExitSpecMode"
# Droid's session ids are UUIDs; anything else in a step is not one to carry on.
_SESSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,99}")


class Kind:
    STARTED = "started"
    PLAN = "plan"
    # Claude Code's: its plan was accepted (ExitPlanMode answered), and the work goes on.
    PLAN_ACCEPTED = "plan-accepted"
    TOOL = "tool"
    TOOL_ERROR = "tool-error"
    MESSAGE = "message"
    SUMMARY = "summary"


@dataclass(frozen=True)
class Seen:
    """What one notification means to the worker."""

    steps: tuple[dict[str, Any], ...] = ()
    error: str | None = None
    # The session's turn ended: `finished` if Droid completed it, else `error` says why not.
    ended: bool = False
    finished: bool = False


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tool_name(name: str) -> str:
    """`box___wallet__pay` is the box's `wallet.pay`; Droid's own tools keep their names."""
    if name.startswith(MCP_PREFIX):
        return name[len(MCP_PREFIX) :].replace("__", ".")
    return name


def _step(text: str, session: str, kind: str, **more: Any) -> dict[str, Any]:
    return {
        "text": _cut(text, MAX_STEP_TEXT) or kind,
        "data": {"session": session, "kind": kind, **more},
    }


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


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
        return _step(f"Droid {began}, on {self._model}", self.session, Kind.STARTED)

    def refusal(self, why: str) -> dict[str, Any]:
        """The step for what the worker refused Droid (boxd.workers.droid.answers)."""
        return _step(f"Refused: {why}", self.session, Kind.TOOL_ERROR)

    def read(self, notification: dict[str, Any]) -> Seen:
        if notification.get("sessionId") not in (None, self.session):
            # A subagent's session (Droid's Task tool): its turn ending is not this one's.
            return Seen()
        kind = notification.get("type")
        if kind == "create_message":
            return self._message(notification.get("message"))
        if kind == "tool_result" and notification.get("isError") is True:
            name = self._tools.get(_text(notification.get("toolUseId")), "a tool")
            why = _text(notification.get("content")).strip() or "no reason given"
            return Seen((_step(f"{name} failed: {why}", self.session, Kind.TOOL_ERROR),))
        if kind == "error":
            said = api_words(_text(notification.get("message")))
            return Seen(error=said or "Droid stopped with an error")
        if kind == "agent_turn_completed":
            reason = _text(notification.get("reason"))
            if reason != "completed":
                why = f"Droid's turn ended: {reason or 'no reason given'}"
                return Seen(error=why, ended=True)
            text = self._last_text or "Droid finished."
            return Seen((_step(text, self.session, Kind.SUMMARY),), ended=True, finished=True)
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
                text = _text(block.get("text")).strip()
                if text:
                    self._last_text = text
                    steps.append(_step(text, self.session, Kind.MESSAGE))
            elif block.get("type") == "tool_use":
                steps.append(self._tool_use(block))
        return Seen(tuple(steps))

    def _tool_use(self, block: dict[str, Any]) -> dict[str, Any]:
        name = _text(block.get("name"))
        shown_name = tool_name(name)
        self._tools[_text(block.get("id"))] = shown_name
        parameters = block.get("input")
        if name == PLAN_TOOL and isinstance(parameters, dict):
            plan = _text(parameters.get("plan")).strip()
            return _step(f"Plan:\n{plan}", self.session, Kind.PLAN)
        shown = _cut(json.dumps(parameters, ensure_ascii=False), MAX_SHOWN_INPUT)
        return _step(f"{shown_name} {shown}", self.session, Kind.TOOL, tool=shown_name)


# How Droid reports an API error: the status, then the body the API (here, the gateway) sent.
_API_ERROR = re.compile(r"(\d{3}) (\{.*\})", re.S)


def api_words(message: str) -> str:
    """The API's own words out of Droid's "403 {"type":"error",...}"; other messages as they are."""
    found = _API_ERROR.fullmatch(message.strip())
    if found is None:
        return message
    try:
        body = json.loads(found.group(2))
    except json.JSONDecodeError:
        return message
    error = body.get("error") if isinstance(body, dict) else None
    words = error.get("message") if isinstance(error, dict) else None
    return words if isinstance(words, str) and words else message


def last_session(steps: list[dict[str, Any]]) -> str | None:
    """The newest Droid session a task's steps name: where a restarted worker carries on."""
    for step in reversed(steps):
        data = step.get("data")
        session = data.get("session") if isinstance(data, dict) else None
        if isinstance(session, str) and _SESSION.fullmatch(session):
            return session
    return None
