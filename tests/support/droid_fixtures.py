"""A fake Droid speaking Droid 0.225.2's JSON-RPC (`droid exec --input-format stream-jsonrpc
--output-format stream-jsonrpc`) over real pipes, with the message shapes the real one sent
against a scripted model. Tests script it line by line: what it expects, what it says."""

import asyncio
import json
import os
from typing import Any

from boxd.workers.droid.rpc import DroidRpc

SESSION = "07821474-dc48-4a8f-8f70-04ef5bed23ca"
ENVELOPE = {"jsonrpc": "2.0", "factoryApiVersion": "1.0.0", "factoryProtocolVersion": "1.220.0"}


async def pipe() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Both ends of an OS pipe as asyncio streams."""
    read_fd, write_fd = os.pipe()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0)
    )
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(write_fd, "wb", 0)
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return reader, writer


class FakeDroid:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._asked = 0

    async def receive(self) -> dict[str, Any]:
        line = await self._reader.readline()
        assert line, "the client closed Droid's input"
        message = json.loads(line)
        assert isinstance(message, dict)
        assert message["jsonrpc"] == "2.0" and message["factoryApiVersion"] == "1.0.0"
        return message

    async def expect(self, method: str) -> dict[str, Any]:
        request = await self.receive()
        assert request["type"] == "request", request
        assert request["method"] == method, request
        return request

    async def send(self, message: dict[str, Any]) -> None:
        self._writer.write(json.dumps({**ENVELOPE, **message}).encode() + b"\n")
        await self._writer.drain()

    async def say(self, line: bytes) -> None:
        self._writer.write(line)
        await self._writer.drain()

    async def respond(self, request: dict[str, Any], result: dict[str, Any]) -> None:
        await self.send({"type": "response", "id": request["id"], "result": result})

    async def fail(self, request: dict[str, Any], message: str, data: str) -> None:
        await self.send(
            {
                "type": "response",
                "id": request["id"],
                "error": {"code": -32600, "message": message, "data": data},
            }
        )

    async def notify(self, notification: dict[str, Any], *, session: str | None = SESSION) -> None:
        params: dict[str, Any] = {"notification": notification}
        if session is not None:
            params["sessionId"] = session
        await self.send(
            {"type": "notification", "method": "droid.session_notification", "params": params}
        )

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Droid's own request; its answer (other lines before it would be a test's mistake)."""
        self._asked += 1
        ident = f"8a68d203-210e-438f-963e-{self._asked:012d}"
        await self.send({"type": "request", "method": method, "id": ident, "params": params})
        answer = await self.receive()
        assert answer["type"] == "response" and answer["id"] == ident, answer
        return answer

    def close(self) -> None:
        self._writer.close()


async def connected(answerer: Any) -> tuple[DroidRpc, FakeDroid]:
    """A client and a fake Droid on two pipes, as a worker and its `droid exec`."""
    to_client, from_droid = await pipe()
    to_droid, from_client = await pipe()
    return DroidRpc(to_client, from_client, answerer), FakeDroid(to_droid, from_droid)


def ask_user_params(*questions: tuple[str, list[str]]) -> dict[str, Any]:
    return {
        "toolCallId": "toolu_1_1",
        "questions": [
            {"index": index, "topic": "Colour", "question": question, "options": options}
            for index, (question, options) in enumerate(questions, 1)
        ],
    }


def exec_permission_params(command: str) -> dict[str, Any]:
    tool_input = {
        "summary": "Delete the build folder now",
        "command": command,
        "riskLevelReason": "It deletes files irreversibly.",
        "riskLevel": "high",
    }
    return {
        "toolUses": [
            {
                "toolUse": {
                    "type": "tool_use",
                    "id": "toolu_1_0",
                    "name": "Execute",
                    "input": tool_input,
                },
                "confirmationType": "exec",
                "details": {
                    "type": "exec",
                    "fullCommand": command,
                    "command": command.split()[0],
                    "extractedCommands": [command.split()[0]],
                    "impactLevel": "high",
                    "riskLevelReason": "It deletes files irreversibly.",
                },
            }
        ],
        "options": [
            {"label": "Yes, allow", "value": "proceed_once"},
            {"label": "Yes, and always allow high impact commands", "value": "proceed_always"},
            {"label": "No, cancel", "value": "cancel"},
        ],
    }


def plan_permission_params(plan: str) -> dict[str, Any]:
    return {
        "toolUses": [
            {
                "toolUse": {
                    "type": "tool_use",
                    "id": "toolu_1_0",
                    "name": "ExitSpecMode",
                    "input": {"plan": plan},
                },
                "confirmationType": "exit_spec_mode",
                "details": {"type": "exit_spec_mode", "plan": plan},
            }
        ],
        "options": [
            {"label": "Proceed with implementation", "value": "proceed_once"},
            {"label": "Proceed, and allow file edits (Low)", "value": "proceed_auto_run_low"},
            {"label": "Proceed, and allow reversible commands", "value": "proceed_auto_run_medium"},
            {"label": "Proceed, and allow all commands (High)", "value": "proceed_auto_run_high"},
            {"label": "No, keep iterating on spec", "value": "cancel"},
        ],
    }


def created(role: str, *content: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "create_message",
        "message": {
            "id": "47a74fae-b26a-406e-96fc-0818ce7abda4",
            "role": role,
            "content": list(content),
            "createdAt": 1796281715309,
            "parentId": "05947215-f151-4834-a9ed-8acfb9732105",
        },
    }


def turn_completed(reason: str = "completed") -> dict[str, Any]:
    return {"type": "agent_turn_completed", "reason": reason, "turnId": "t", "durationMs": 570}
