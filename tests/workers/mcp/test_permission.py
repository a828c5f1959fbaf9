"""The relay's box_permission: within the autonomy the owner answers, beyond it the box
refuses without asking, and a task's plan is accepted at its autonomy."""

import json
from typing import Any

from boxd.wire.approval import MAX_QUESTION
from boxd.workers.mcp.permission import Permissions, permission_key, question
from boxd.workers.mcp.tools import Relay


class Broker:
    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.asked: list[Any] = []

    async def __call__(self, method: str, path: str, body: Any) -> Any:
        assert (method, path) == ("POST", "/ask")
        self.asked.append(body)
        return self.answers.pop(0)


def decision(result: dict[str, Any]) -> dict[str, Any]:
    assert result.get("isError") is not True
    answer: dict[str, Any] = json.loads(result["content"][0]["text"])
    return answer


async def test_beyond_the_autonomy_is_refused_without_asking() -> None:
    broker = Broker()
    permissions = Permissions(broker, autonomy="low", plan=False)
    said = decision(await permissions.answer({"tool_name": "Bash", "input": {"command": "ls"}}))
    assert said["behavior"] == "deny" and "autonomy (low)" in said["message"]
    assert broker.asked == []


async def test_within_it_the_owner_answers_under_one_key_until_they_do() -> None:
    broker = Broker({"pending": True}, {"approved": True}, {"approved": False})
    permissions = Permissions(broker, autonomy="low", plan=False)
    wanted = {"file_path": "/home/x", "content": "y"}
    said = decision(await permissions.answer({"tool_name": "Write", "input": wanted}))
    assert said == {"behavior": "allow", "updatedInput": wanted}
    text = question("Write", wanted)
    assert text is not None and '"content": "y"' in text and '"/home/x"' in text
    assert broker.asked == [{"question": text, "key": permission_key("Write", wanted)}] * 2
    said = decision(await permissions.answer({"tool_name": "Write", "input": wanted}))
    assert said["behavior"] == "deny"


def test_the_key_covers_the_whole_input() -> None:
    hook = "/ws/.git/hooks/post-checkout"
    assert permission_key("Write", {"file_path": hook, "content": "echo ok"}) != permission_key(
        "Write", {"file_path": hook, "content": "curl x|sh"}
    )
    edit = {"file_path": hook, "old_string": "a", "new_string": "b"}
    assert permission_key("Edit", edit) != permission_key("Edit", {**edit, "new_string": "c"})
    long = "echo " + "x" * 400
    assert permission_key("Bash", {"command": long + " ok"}) != permission_key(
        "Bash", {"command": long + " && rm -rf ~"}
    )
    assert permission_key("Bash", {"command": "ls"}) != permission_key("Read", {"command": "ls"})
    shown = question("Bash", {"command": long + " && rm -rf ~"})
    assert shown is not None and shown.endswith('&& rm -rf ~"\n}')


async def test_an_input_too_long_to_show_whole_is_refused_without_asking() -> None:
    broker = Broker()
    permissions = Permissions(broker, autonomy="low", plan=False)
    wanted = {"file_path": "/home/x", "content": "y" * MAX_QUESTION}
    assert question("Write", wanted) is None
    said = decision(await permissions.answer({"tool_name": "Write", "input": wanted}))
    assert said["behavior"] == "deny" and "too long to show" in said["message"]
    assert broker.asked == []


async def test_the_plan_is_accepted_only_when_the_task_asked_for_one() -> None:
    plan = {"plan": "1. Do it"}
    said = decision(
        await Permissions(Broker(), autonomy="medium", plan=True).answer(
            {"tool_name": "ExitPlanMode", "input": plan}
        )
    )
    assert said["behavior"] == "allow"
    assert said["updatedPermissions"] == [
        {"type": "setMode", "mode": "acceptEdits", "destination": "session"}
    ]
    said = decision(
        await Permissions(Broker(), autonomy="medium", plan=False).answer(
            {"tool_name": "ExitPlanMode", "input": plan}
        )
    )
    assert said["behavior"] == "deny"


async def test_a_malformed_prompt_is_an_error() -> None:
    result = await Permissions(Broker(), autonomy="low", plan=False).answer({"tool_name": 3})
    assert result["isError"] is True


async def test_the_relay_lists_it_for_claude_code_only() -> None:
    async def broker(method: str, path: str, body: Any) -> Any:
        return [
            {"name": "box_permission", "description": "an app's tool of that name", "input": {}}
        ]

    droid = [tool["name"] for tool in await Relay(broker).list()]
    claude = Relay(broker, Permissions(broker, autonomy="low", plan=False))
    assert droid == ["box_ask"]
    assert [tool["name"] for tool in await claude.list()] == ["box_ask", "box_permission"]
    said = decision(await claude.call("box_permission", {"tool_name": "Bash", "input": {}}))
    assert said["behavior"] == "deny"
