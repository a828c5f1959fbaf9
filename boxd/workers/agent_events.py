"""What the Droid and Claude Code workers share in reading their agent's events as steps.

Each agent tells its work its own way (Droid's session notifications, boxd.workers.droid.events;
Claude Code's stream-json, boxd.workers.claude.events), but the steps are the same: their kinds,
their data (every step carries the agent's session id, so a worker started again carries that
session on: `last_session`), how much of a text they hold, how a tool's use is shown.
"""

import json
import re
from dataclasses import dataclass
from typing import Any

from boxd.reading.caps import MAX_STEP_TEXT

# What a tool step shows of the tool's input; the owner reads steps, not transcripts.
MAX_SHOWN_INPUT = 500
# Both agents' session ids are UUIDs; anything else in a step is not one to carry on.
_SESSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,99}")
# How an agent reports an API error: the status, then the body the API (here, the gateway) sent.
_API_ERROR = re.compile(r"(\d{3}) (\{.*\})", re.S)


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
    """What one of the agent's events means to the worker."""

    steps: tuple[dict[str, Any], ...] = ()
    error: str | None = None
    # The agent's turn (Claude Code: its run) ended: `finished` if it completed the task's turn,
    # else `error` says why not.
    ended: bool = False
    finished: bool = False


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def as_text(value: Any) -> str:
    """A field that should be a string, or "" for what the agent sent instead."""
    return value if isinstance(value, str) else ""


def step(text: str, session: str, kind: str, **more: Any) -> dict[str, Any]:
    return {
        "text": cut(text, MAX_STEP_TEXT) or kind,
        "data": {"session": session, "kind": kind, **more},
    }


def tool_name(name: str, mcp_prefix: str) -> str:
    """The box's tools by their own names (`wallet.pay` for Droid's `box___wallet__pay`, Claude
    Code's `mcp__box__wallet__pay`); the agent's own tools keep theirs."""
    if name.startswith(mcp_prefix):
        return name[len(mcp_prefix) :].replace("__", ".")
    return name


def tool_use_step(
    block: dict[str, Any],
    session: str,
    tools: dict[str, str],
    *,
    mcp_prefix: str,
    plan_tool: str,
) -> dict[str, Any]:
    """The step for one `tool_use` of the model's: the plan, when the tool is the agent's way of
    handing one in, else the tool by its shown name and its input, cut. `tools` learns the
    shown name by the use's id, for the step of its result."""
    name = as_text(block.get("name"))
    shown_name = tool_name(name, mcp_prefix)
    tools[as_text(block.get("id"))] = shown_name
    parameters = block.get("input")
    if name == plan_tool and isinstance(parameters, dict):
        plan = as_text(parameters.get("plan")).strip()
        return step(f"Plan:\n{plan}", session, Kind.PLAN)
    shown = cut(json.dumps(parameters, ensure_ascii=False), MAX_SHOWN_INPUT)
    return step(f"{shown_name} {shown}", session, Kind.TOOL, tool=shown_name)


def api_words(message: str) -> str:
    """The API's own words out of "403 {"type":"error",...}"; other messages as they are."""
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
    """The newest session a task's steps name: where a restarted worker carries on."""
    for one in reversed(steps):
        data = one.get("data")
        session = data.get("session") if isinstance(data, dict) else None
        if isinstance(session, str) and _SESSION.fullmatch(session):
            return session
    return None
