"""The box's tools as MCP tools: `box_ask` and one `<app>__<verb>` per tool of the task, each
forwarded to the broker with a key that makes it happen once (docs/spec/broker-api.txt, "How
Droid reaches the broker").

Keys:
- `box_ask {question}` asks with `mcp.ask.<hash of the question>`: the same question is the same
  approval, answered once, whoever asks it again and whenever.
- `<app>__<verb> {input}` calls with `mcp.<tool>.<hash of the input>.<count>`, count being how
  many times this relay already got a final answer (a result or an error, not a pending) for
  the same tool and input. So asking again after a pending answer keeps the key and goes on
  waiting for the same approval, while a deliberate second identical call (a second payment of
  the same amount to the same payee) is a new key, and runs.
"""

import json
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from boxd.reading.canonical_json import input_hash
from boxd.workers.claude.autonomy import PERMISSION_TOOL
from boxd.workers.unix_http import BROKER_FAILURES

ASK = "box_ask"
# The permission-prompt tool, listed only for Claude Code (boxd.workers.mcp.permission).
PERMISSION = PERMISSION_TOOL
# A tool name in a key: tool names may be 200 characters and so may a key (boxd.wire.approval's
# MAX_KEY); a longer name is cut and told apart by a hash of it, so a key is at most
# 4 + 64 + 1 + 64 + 1 + 20 = 154 characters.
KEY_TOOL_CHARS = 64
KEY_TOOL_HASH = 16

ASK_TOOL = {
    "name": ASK,
    "description": (
        "Ask the box owner a yes-or-no question and wait for the answer, for example before "
        "doing something they may not want. The answer says whether they approved. If they "
        "have not answered yet, call box_ask again with the same question to keep waiting."
    ),
    "inputSchema": {
        "type": "object",
        "properties": {
            "question": {"type": "string", "description": "The question, for a person to read."}
        },
        "required": ["question"],
    },
}

# GET or POST to the broker: (method, path, body) -> its JSON answer.
Broker = Callable[[str, str, Any], Awaitable[Any]]


class UnknownTool(Exception):
    """The client named a tool that is not among this task's."""


@dataclass(frozen=True)
class BoxTool:
    name: str  # as the broker knows it: `wallet.pay`
    description: str
    schema: dict[str, Any]

    @property
    def mcp_name(self) -> str:
        # MCP tool names cannot contain dots.
        return self.name.replace(".", "__")


def key_tool(mcp_name: str) -> str:
    if len(mcp_name) <= KEY_TOOL_CHARS:
        return mcp_name
    kept = KEY_TOOL_CHARS - KEY_TOOL_HASH - 1
    return f"{mcp_name[:kept]}-{input_hash(mcp_name)[:KEY_TOOL_HASH]}"


def ask_key(question: str) -> str:
    return f"mcp.ask.{input_hash(question)}"


def call_key(mcp_name: str, arguments: dict[str, Any], count: int) -> str:
    return f"mcp.{key_tool(mcp_name)}.{input_hash(arguments)}.{count}"


def text_result(text: str, *, error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": error}


def _shown(output: Any) -> str:
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)


def _box_tool(entry: Any) -> BoxTool | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        return None
    schema = entry.get("input")
    description = entry.get("description")
    return BoxTool(
        name=entry["name"],
        description=description if isinstance(description, str) else "",
        # MCP wants an object schema; every tool's input is a pydantic model, so this is one.
        schema=schema if isinstance(schema, dict) else {"type": "object"},
    )


class PermissionAnswers(Protocol):
    # The tool as tools/list shows it.
    spec: dict[str, Any]

    async def answer(self, arguments: dict[str, Any]) -> dict[str, Any]: ...


class Relay:
    def __init__(self, broker: Broker, permissions: PermissionAnswers | None = None) -> None:
        self._broker = broker
        # Claude Code's permission prompts (boxd.workers.mcp.permission); None for Droid.
        self._permissions = permissions
        self._tools: dict[str, BoxTool] | None = None
        # (MCP tool name, input hash) -> final answers this relay got for it. It starts again
        # from 0 when the relay does (Droid resumed after a restart): a resumed Droid that makes
        # the call it made before gets the logged result under the same key instead of paying
        # twice. That is the intent, and its price: a deliberate repeat of an identical call
        # across a restart is answered from the log too.
        self._answered: Counter[tuple[str, str]] = Counter()

    async def tools(self) -> dict[str, BoxTool]:
        # The task's tools are fixed when it starts, so one answer serves the relay's life.
        if self._tools is None:
            listed = await self._broker("GET", "/tools", None)
            found = [_box_tool(entry) for entry in listed] if isinstance(listed, list) else []
            tools: dict[str, BoxTool] = {}
            for tool in found:
                if tool is not None and tool.mcp_name not in (ASK, PERMISSION):
                    tools.setdefault(tool.mcp_name, tool)
            self._tools = tools
        return self._tools

    async def list(self) -> list[dict[str, Any]]:
        listed = [ASK_TOOL]
        if self._permissions is not None:
            listed.append(self._permissions.spec)
        for tool in (await self.tools()).values():
            listed.append(
                {"name": tool.mcp_name, "description": tool.description, "inputSchema": tool.schema}
            )
        return listed

    async def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The MCP result of one `tools/call`; UnknownTool for a name that is not a tool."""
        if name == ASK:
            return await self._ask(arguments)
        if name == PERMISSION and self._permissions is not None:
            return await self._permissions.answer(arguments)
        tools = await self.tools()
        tool = tools.get(name)
        if tool is None:
            known = ", ".join([ASK, *tools]) or ASK
            raise UnknownTool(f"there is no tool {name}; this task's tools are {known}")
        return await self._call(tool, arguments)

    async def _ask(self, arguments: dict[str, Any]) -> dict[str, Any]:
        question = arguments.get("question")
        if not isinstance(question, str):
            return text_result(
                "box_ask needs question, a string: the question for the box owner", error=True
            )
        body = {"question": question, "key": ask_key(question)}
        answer = await self._forward("/ask", body)
        if isinstance(answer, str):
            return text_result(answer, error=True)
        if answer.get("pending"):
            return text_result(
                "The box owner has not answered yet. Call box_ask again with the same question "
                "to keep waiting for the answer."
            )
        if answer.get("approved") is True:
            return text_result("Approved: the box owner said yes.")
        if answer.get("approved") is False:
            return text_result("Not approved: the box owner said no.")
        return text_result(f"The broker answered /ask with {_shown(answer)[:200]}", error=True)

    async def _call(self, tool: BoxTool, arguments: dict[str, Any]) -> dict[str, Any]:
        same = (tool.mcp_name, input_hash(arguments))
        body = {
            "tool": tool.name,
            "input": arguments,
            "key": call_key(tool.mcp_name, arguments, self._answered[same]),
        }
        answer = await self._forward("/call", body)
        if isinstance(answer, str):
            return text_result(answer, error=True)
        if answer.get("pending"):
            waiting = answer.get("error") or "Waiting for the box owner's OK."
            return text_result(
                f"{waiting} This is not an error: call {tool.mcp_name} again with exactly the "
                "same input to keep waiting; it still runs only once."
            )
        if answer.get("ok") is True:
            self._answered[same] += 1
            return text_result(_shown(answer.get("output")))
        if answer.get("ok") is False:
            self._answered[same] += 1
            error = answer.get("error")
            return text_result(error if isinstance(error, str) else _shown(error), error=True)
        return text_result(f"The broker answered /call with {_shown(answer)[:200]}", error=True)

    async def _forward(self, path: str, body: dict[str, Any]) -> dict[str, Any] | str:
        """The broker's answer, or in words why there is none."""
        try:
            answer = await self._broker("POST", path, body)
        except BROKER_FAILURES as failure:
            return str(failure)
        if not isinstance(answer, dict):
            return f"The broker answered {path} with {_shown(answer)[:200]}"
        return answer
