"""Copied into a test machine and run by a fake task's `sh` line, as the task's user in its
sandbox: starts the MCP relay as Droid does (stdio, BOX_SOCKET from the task), pays Ada 30 cents
twice, then starts the relay again (Droid resumed) and makes the same payment once more.
Prints one line of JSON: each call's isError and text."""

import json
import subprocess
import sys
from typing import Any

RELAY = [sys.executable, "-I", "-m", "boxd.workers.mcp.relay"]
PAY = {"name": "wallet__pay", "arguments": {"to": "Ada", "cents": 30}}


def session(calls: int) -> list[tuple[bool, str]]:
    relay = subprocess.Popen(RELAY, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert relay.stdin is not None and relay.stdout is not None
    answers: list[tuple[bool, str]] = []

    def ask(number: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        message = {"jsonrpc": "2.0", "id": number, "method": method, "params": params}
        assert relay.stdin is not None and relay.stdout is not None
        relay.stdin.write(json.dumps(message).encode() + b"\n")
        relay.stdin.flush()
        answer: dict[str, Any] = json.loads(relay.stdout.readline())
        assert answer["id"] == number and "result" in answer, answer
        result: dict[str, Any] = answer["result"]
        return result

    ask(1, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}})
    listed = ask(2, "tools/list", {})
    assert [t["name"] for t in listed["tools"]] == ["box_ask", "wallet__pay", "wallet__balance"]
    for number in range(calls):
        result = ask(3 + number, "tools/call", PAY)
        answers.append((result["isError"], result["content"][0]["text"]))
    relay.stdin.close()
    relay.wait(timeout=30)
    return answers


if __name__ == "__main__":
    print(json.dumps(session(2) + session(1)))
