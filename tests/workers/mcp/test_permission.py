"""The relay's box_permission: within the autonomy the owner answers, beyond it the box
refuses without asking, and a task's plan is accepted at its autonomy."""

import json
from pathlib import Path
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


# Where no edit in these tests lands, unless it says so.
HOME = Path("/nowhere/home")
WORK = Path("/nowhere/work")


def low(broker: Any, home: Path = HOME, work: Path = WORK) -> Permissions:
    return Permissions(broker, autonomy="low", plan=False, home=home, work=work)


def decision(result: dict[str, Any]) -> dict[str, Any]:
    assert result.get("isError") is not True
    answer: dict[str, Any] = json.loads(result["content"][0]["text"])
    return answer


async def test_beyond_the_autonomy_is_refused_without_asking() -> None:
    broker = Broker()
    permissions = low(broker)
    said = decision(await permissions.answer({"tool_name": "Bash", "input": {"command": "ls"}}))
    assert said["behavior"] == "deny" and "autonomy (low)" in said["message"]
    assert broker.asked == []


async def test_within_it_the_owner_answers_under_one_key_until_they_do() -> None:
    broker = Broker({"pending": True}, {"approved": True}, {"approved": False})
    permissions = low(broker)
    wanted = {"file_path": "/home/x", "content": "y"}
    said = decision(await permissions.answer({"tool_name": "Write", "input": wanted}))
    assert said == {"behavior": "allow", "updatedInput": wanted}
    text = question("Write", wanted)
    assert text is not None and '"content": "y"' in text and '"/home/x"' in text
    assert broker.asked == [{"question": text, "key": permission_key("Write", wanted)}] * 2
    # The same request made again is asked again, under the next key: one approval is one use.
    said = decision(await permissions.answer({"tool_name": "Write", "input": wanted}))
    assert said["behavior"] == "deny"
    assert broker.asked[-1]["key"] == permission_key("Write", wanted, count=1)
    assert permission_key("Write", wanted, count=1) != permission_key("Write", wanted)


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
    permissions = low(broker)
    wanted = {"file_path": "/home/x", "content": "y" * MAX_QUESTION}
    assert question("Write", wanted) is None
    said = decision(await permissions.answer({"tool_name": "Write", "input": wanted}))
    assert said["behavior"] == "deny" and "too long to show" in said["message"]
    assert broker.asked == []


async def test_the_plan_is_accepted_only_when_the_task_asked_for_one() -> None:
    plan = {"plan": "1. Do it"}
    said = decision(
        await Permissions(Broker(), autonomy="medium", plan=True, home=HOME, work=WORK).answer(
            {"tool_name": "ExitPlanMode", "input": plan}
        )
    )
    assert said["behavior"] == "allow"
    assert said["updatedPermissions"] == [
        {"type": "setMode", "mode": "acceptEdits", "destination": "session"}
    ]
    said = decision(
        await Permissions(Broker(), autonomy="medium", plan=False, home=HOME, work=WORK).answer(
            {"tool_name": "ExitPlanMode", "input": plan}
        )
    )
    assert said["behavior"] == "deny"


async def test_a_malformed_prompt_is_an_error() -> None:
    result = await low(Broker()).answer({"tool_name": 3})
    assert result["isError"] is True


async def test_the_relay_lists_it_for_claude_code_only() -> None:
    async def broker(method: str, path: str, body: Any) -> Any:
        return [
            {"name": "box_permission", "description": "an app's tool of that name", "input": {}}
        ]

    droid = [tool["name"] for tool in await Relay(broker).list()]
    claude = Relay(broker, low(broker))
    assert droid == ["box_ask"]
    assert [tool["name"] for tool in await claude.list()] == ["box_ask", "box_permission"]
    said = decision(await claude.call("box_permission", {"tool_name": "Bash", "input": {}}))
    assert said["behavior"] == "deny"


async def test_an_edit_in_the_task_s_home_is_refused_without_asking_links_followed(
    tmp_path: Path,
) -> None:
    """As a task found it: a link another task left in the workspace leads to `../home`, and
    the path the owner would read looks like a workspace file."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "scripts").symlink_to("../home")
    broker = Broker()
    permissions = low(broker, home, work)
    for path in (
        f"{work}/scripts/.bashrc",
        "scripts/.gitconfig",
        f"{home}/.claude/x.sh",
        str(home),
    ):
        said = decision(
            await permissions.answer(
                {"tool_name": "Write", "input": {"file_path": path, "content": "ls() { :; }"}}
            )
        )
        assert said["behavior"] == "deny", path
        assert "the task's own home" in said["message"] and str(home) in said["message"]
    notebook = {"notebook_path": "scripts/n.ipynb", "new_source": "x"}
    said = decision(await permissions.answer({"tool_name": "NotebookEdit", "input": notebook}))
    assert said["behavior"] == "deny"
    assert broker.asked == []


async def test_an_edit_through_a_link_shows_and_binds_the_file_it_writes(tmp_path: Path) -> None:
    home, work, elsewhere = tmp_path / "home", tmp_path / "work", tmp_path / "elsewhere"
    for folder in (home, work, elsewhere):
        folder.mkdir()
    (work / "docs").symlink_to(elsewhere)
    broker = Broker({"approved": True}, {"approved": True})
    permissions = low(broker, home, work)
    wanted = {"file_path": f"{work}/docs/a.txt", "content": "y"}
    said = decision(await permissions.answer({"tool_name": "Write", "input": wanted}))
    assert said["behavior"] == "allow"
    real = str(elsewhere.resolve() / "a.txt")
    assert broker.asked[0]["question"].endswith(f"the file it writes is {real}")
    assert broker.asked[0]["key"] == permission_key("Write", wanted, real)
    assert permission_key("Write", wanted, real) != permission_key("Write", wanted)
    # A plain path says nothing more, and binds to itself.
    plain = {"file_path": f"{work}/a.txt", "content": "y"}
    await permissions.answer({"tool_name": "Write", "input": plain})
    assert broker.asked[1] == {
        "question": question("Write", plain),
        "key": permission_key("Write", plain),
    }
