"""The Droid worker with the real Droid (0.225.2, where boxd installed it) against a scripted
model and a fake broker on a Unix socket: what the fake Droid of test_worker.py plays is
what the real one does. Skipped where Droid is not installed; each test starts Droid (~5 s)."""

from pathlib import Path
from typing import Any

import pytest

from boxd.droid.release import droid_binary
from boxd.workers.agent_config import RESUME_PROMPT
from boxd.workers.droid.answers import YES
from boxd.workers.droid.worker import DroidFailed, run
from tests.support.scripted_model import ScriptedModel
from tests.support.worker_broker import ScriptedBroker, agent_task, run_worker

pytestmark = pytest.mark.skipif(
    not droid_binary().exists(), reason=f"Droid is not installed at {droid_binary()}"
)

MODEL = "claude-sonnet-4-6"


def task(prompt: str, autonomy: str = "low", plan: bool = False) -> dict[str, Any]:
    return agent_task("droid test", MODEL, prompt, autonomy, plan)


def tool_results(request: dict[str, Any]) -> list[str]:
    last = request["messages"][-1]["content"]
    return [block["content"] for block in last if block.get("type") == "tool_result"]


async def test_droids_question_is_the_owners_approval_and_the_yes_reaches_the_model(
    socket_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    questionnaire = (
        "1. [question] Should the button be red?\n[topic] Colour\n[option] Yes\n[option] No\n"
    )
    made = tmp_path / "work" / "button.txt"
    made.parent.mkdir()
    broker = ScriptedBroker(task("Make a button."), {"pending": True}, {"approved": True})
    async with ScriptedModel(
        [
            {"type": "text", "text": "I need to know the colour."},
            {"type": "tool_use", "name": "AskUser", "input": {"questionnaire": questionnaire}},
        ],
        [
            {
                "type": "tool_use",
                "name": "Create",
                "input": {"file_path": str(made), "content": "red\n"},
            }
        ],
        [{"type": "text", "text": "Made a red button."}],
    ) as model:
        await run_worker(
            run, broker, model.url, socket_dir, tmp_path / "home", made.parent, monkeypatch
        )
    # The session has the task's title: Droid asks the model for none, which the task would pay.
    assert model.requests == model.tool_requests()
    offered = [tool["name"] for tool in model.tool_requests()[0]["tools"]]
    assert "AskUser" in offered and "Task" not in offered
    text = "Droid asks: Should the button be red? (Droid suggested: Yes / No)"
    assert [body["question"] for body in broker.asked] == [text, text]
    assert broker.asked[0]["key"] == broker.asked[1]["key"]
    assert broker.asked[0]["key"].startswith("droid.ask.")
    (answer,) = tool_results(model.tool_requests()[1])
    assert answer == f"1. [question] Should the button be red?\n[answer] {YES}"
    assert made.read_text() == "red\n"
    assert broker.kinds() == ["started", "message", "tool", "tool", "summary"]
    assert broker.steps[-1]["text"] == "Made a red button."


async def test_a_command_beyond_low_is_refused_and_the_task_fails(
    socket_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work_dir = tmp_path / "work"
    work_dir.mkdir()
    command = f"echo ran > {work_dir}/ran.txt"
    broker = ScriptedBroker(task("Clean up."))
    async with ScriptedModel(
        [
            {
                "type": "tool_use",
                "name": "Execute",
                "input": {
                    "summary": "Delete the build folder now",
                    "command": command,
                    "riskLevelReason": "It deletes files irreversibly.",
                    "riskLevel": "high",
                },
            }
        ],
        [{"type": "text", "text": "Cleaned up."}],
    ) as model:
        with pytest.raises(DroidFailed, match=r"permission for Execute .*--auto low"):
            await run_worker(
                run, broker, model.url, socket_dir, tmp_path / "home", work_dir, monkeypatch
            )
    assert not (work_dir / "ran.txt").exists()
    assert broker.kinds() == ["started", "tool", "tool-error"]
    assert broker.steps[-1]["text"].startswith("Refused: Droid needed permission for Execute")


async def test_a_planned_task_goes_on_at_its_autonomy_and_a_restart_carries_on(
    socket_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work_dir = tmp_path / "work"
    work_dir.mkdir()
    home = tmp_path / "home"
    broker = ScriptedBroker(task("Make a.txt.", plan=True))
    async with ScriptedModel(
        [{"type": "tool_use", "name": "ExitSpecMode", "input": {"plan": "1. Create a.txt"}}],
        [
            {
                "type": "tool_use",
                "name": "Create",
                "input": {"file_path": str(work_dir / "a.txt"), "content": "A\n"},
            }
        ],
        [{"type": "text", "text": "Created a.txt."}],
    ) as model:
        await run_worker(run, broker, model.url, socket_dir, home, work_dir, monkeypatch)
    assert (work_dir / "a.txt").read_text() == "A\n"
    assert broker.kinds() == ["started", "plan", "tool", "summary"]
    session = broker.steps[0]["data"]["session"]

    again = broker.started_again()
    async with ScriptedModel([{"type": "text", "text": "Carried on."}]) as model:
        await run_worker(run, again, model.url, socket_dir, home, work_dir, monkeypatch)
    (request,) = model.tool_requests()
    said = [block.get("text") for message in request["messages"] for block in message["content"]]
    assert "Make a.txt." in said and "Created a.txt." in said
    assert said[-1] == RESUME_PROMPT
    assert "ExitSpecMode" not in [tool["name"] for tool in request["tools"]]
    assert [step["data"]["session"] for step in again.steps] == [session, session]
    assert again.steps[0]["text"] == f"Droid carried on where it stopped, on {MODEL}"
    assert again.steps[-1]["text"] == "Carried on."
