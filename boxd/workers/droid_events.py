"""Droid's stream of JSON events (`droid exec --output-format stream-json`), read as steps.

Each event is one line: `system` (init, with the session id), `message` (the user's prompt and
the assistant's words), `tool_call` and `tool_result`, `completion` (the final text) and
`error`. Every step carries the session id in its data, so a worker started again forks the
newest session and carries on (see droid.py).
"""

import json
import re
from dataclasses import dataclass
from typing import Any

from boxd.caps import MAX_STEP_TEXT
from boxd.workers.droid_config import MCP_PREFIX

# What a tool step shows of the tool's input; the owner reads steps, not transcripts.
MAX_SHOWN_INPUT = 500
PLAN_TOOL = "ExitSpecMode"
# Droid's session ids are UUIDs; anything else in a step is not one to fork.
_SESSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,99}")


class Kind:
    STARTED = "started"
    PLAN = "plan"
    TOOL = "tool"
    TOOL_ERROR = "tool-error"
    MESSAGE = "message"
    SUMMARY = "summary"


@dataclass(frozen=True)
class Seen:
    """What one event means to the worker."""

    step: dict[str, Any] | None = None
    error: str | None = None
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


def read_event(event: Any, model: str, *, resumed: bool = False) -> Seen:
    if not isinstance(event, dict):
        return Seen()
    session = _text(event.get("session_id"))
    kind = event.get("type")
    if kind == "system" and event.get("subtype") == "init" and session:
        began = "carried on where it stopped" if resumed else "started working"
        return Seen(_step(f"Droid {began}, on {model}", session, Kind.STARTED))
    if not session:
        return Seen()
    if kind == "message" and event.get("role") == "assistant":
        text = _text(event.get("text")).strip()
        return Seen(_step(text, session, Kind.MESSAGE) if text else None)
    if kind == "tool_call":
        name = _text(event.get("toolName"))
        parameters = event.get("parameters")
        if name == PLAN_TOOL and isinstance(parameters, dict):
            plan = _text(parameters.get("plan")).strip()
            return Seen(_step(f"Plan:\n{plan}", session, Kind.PLAN))
        shown = _cut(json.dumps(parameters, ensure_ascii=False), MAX_SHOWN_INPUT)
        return Seen(_step(f"{tool_name(name)} {shown}", session, Kind.TOOL, tool=tool_name(name)))
    if kind == "tool_result" and event.get("isError") is True:
        name = tool_name(_text(event.get("toolId")))
        error = event.get("error")
        message = _text(error.get("message")) if isinstance(error, dict) else ""
        return Seen(
            _step(f"{name} failed: {message or 'no reason given'}", session, Kind.TOOL_ERROR)
        )
    if kind == "completion":
        text = _text(event.get("finalText")).strip() or "Droid finished."
        return Seen(_step(text, session, Kind.SUMMARY), finished=True)
    if kind == "error":
        return Seen(error=api_words(_text(event.get("message"))) or "Droid stopped with an error")
    return Seen()


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
