"""The Droid worker's conversation with Droid over JSON-RPC (boxd.workers.droid.worker.converse), a
fake Droid on real pipes playing what the real one did against a scripted model."""

import asyncio
from pathlib import Path
from typing import Any

from boxd.workers.agent_config import RESUME_PROMPT
from boxd.workers.droid.answers import YES, Answers
from boxd.workers.droid.config import DISABLED_TOOLS, MODEL_CHOICE
from boxd.workers.droid.rpc import ASK_USER, REQUEST_PERMISSION
from boxd.workers.droid.worker import Steps, converse
from tests.support.droid_fixtures import (
    SESSION,
    FakeDroid,
    ask_user_params,
    connected,
    created,
    exec_permission_params,
    turn_completed,
)

TASK = {"id": "t1", "title": "A button", "model": "claude-sonnet-4-6", "prompt": "Make a button."}


class FakeBroker:
    def __init__(self, *asks: Any) -> None:
        self.steps: list[dict[str, Any]] = []
        self.asked: list[dict[str, Any]] = []
        self._asks = list(asks)

    async def step(self, text: str, data: Any = None) -> Any:
        self.steps.append({"text": text, "data": data})
        return {}

    async def post(self, path: str, body: Any) -> Any:
        assert path == "/ask"
        self.asked.append(body)
        return self._asks.pop(0)

    def shown(self) -> list[tuple[str, str]]:
        return [(step["data"]["kind"], step["text"]) for step in self.steps]


async def talk(
    broker: FakeBroker, droid_side: Any, *, resume: str | None = None, plan: bool = False
) -> tuple[bool, str | None]:
    """Runs the worker's side against a script of Droid's side; both must end."""
    answers = Answers(broker.post, autonomy="low", plan=plan)
    rpc, droid = await connected(answers)
    serving = asyncio.create_task(rpc.serve())
    steps = Steps(broker)  # type: ignore[arg-type]
    playing = asyncio.create_task(droid_side(droid))
    result = await converse(
        rpc, steps, task=TASK, work_dir=Path("/w"), resume=resume, answers=answers
    )
    await steps.flush()
    await playing
    droid.close()
    await serving
    return result


async def start(droid: FakeDroid, prompt: str = "Make a button.") -> None:
    request = await droid.expect("droid.initialize_session")
    assert request["params"]["modelId"] == MODEL_CHOICE
    assert request["params"]["autonomyLevel"] == "low"
    assert request["params"]["cwd"] == "/w"
    assert request["params"]["title"] == "A button"
    assert set(request["params"]["disabledToolIds"]) == set(DISABLED_TOOLS)
    await droid.respond(request, {"sessionId": SESSION, "session": {"messages": []}})
    message = await droid.expect("droid.add_user_message")
    assert message["params"] == {"text": prompt}
    await droid.respond(message, {})


async def test_droids_question_becomes_the_owners_approval_and_the_answer_goes_back() -> None:
    broker = FakeBroker({"pending": True}, {"approved": True})
    answered: list[dict[str, Any]] = []

    async def droid_side(droid: FakeDroid) -> None:
        await start(droid)
        await droid.notify(
            created(
                "assistant",
                {"type": "text", "text": "I need to know which colour."},
                {
                    "type": "tool_use",
                    "id": "toolu_1_1",
                    "name": "AskUser",
                    "input": {"questionnaire": "1. [question] Red?\n[option] Yes\n[option] No"},
                },
            )
        )
        answered.append(await droid.ask(ASK_USER, ask_user_params(("Red?", ["Yes", "No"]))))
        await droid.notify(created("assistant", {"type": "text", "text": "Made it red."}))
        await droid.notify(turn_completed())

    assert await talk(broker, droid_side) == (True, None)
    assert answered[0]["result"]["answers"] == [{"index": 1, "question": "Red?", "answer": YES}]
    assert [body["question"] for body in broker.asked] == [
        "Droid asks: Red? (Droid suggested: Yes / No)"
    ] * 2
    assert broker.asked[0]["key"] == broker.asked[1]["key"]
    assert broker.asked[0]["key"].startswith("droid.ask.")
    assert broker.shown() == [
        ("started", "Droid started working, on claude-sonnet-4-6"),
        ("message", "I need to know which colour."),
        ("tool", 'AskUser {"questionnaire": "1. [question] Red?\\n[option] Yes\\n[option] No"}'),
        ("summary", "Made it red."),
    ]
    assert all(step["data"]["session"] == SESSION for step in broker.steps)


async def test_a_permission_beyond_the_autonomy_is_refused_and_the_task_does_not_finish() -> None:
    broker = FakeBroker()
    answered: list[dict[str, Any]] = []

    async def droid_side(droid: FakeDroid) -> None:
        await start(droid)
        answered.append(await droid.ask(REQUEST_PERMISSION, exec_permission_params("rm -rf b")))
        # What Droid 0.225.2 says after a cancel: the tool failed, the turn "completed".
        await droid.notify(
            {"type": "permission_resolved", "toolUseIds": [], "selectedOption": "cancel"},
            session=None,
        )
        await droid.notify(
            {
                "type": "tool_result",
                "toolUseId": "toolu_1_0",
                "content": "Error: Tool execution cancelled by user",
                "isError": True,
            }
        )
        await droid.notify(turn_completed())

    finished, error = await talk(broker, droid_side)
    assert answered[0]["result"] == {"selectedOption": "cancel"}
    assert not finished
    assert error is not None and "Execute rm -rf b" in error and "--auto low" in error
    assert broker.shown()[-1] == ("tool-error", f"Refused: {error}")
    assert "summary" not in [kind for kind, _ in broker.shown()]


async def test_a_restarted_worker_loads_the_session_and_says_to_carry_on() -> None:
    broker = FakeBroker()

    async def droid_side(droid: FakeDroid) -> None:
        load = await droid.expect("droid.load_session")
        assert load["params"]["sessionId"] == SESSION
        assert set(load["params"]["disabledToolIds"]) == set(DISABLED_TOOLS)
        await droid.respond(load, {"session": {"messages": []}})
        settings = await droid.expect("droid.update_session_settings")
        assert settings["params"]["autonomyLevel"] == "low"
        assert set(settings["params"]["disabledToolIds"]) == set(DISABLED_TOOLS)
        await droid.respond(settings, {})
        message = await droid.expect("droid.add_user_message")
        assert message["params"] == {"text": RESUME_PROMPT}
        await droid.respond(message, {})
        await droid.notify(turn_completed())

    assert await talk(broker, droid_side, resume=SESSION) == (True, None)
    assert broker.shown()[0] == (
        "started",
        "Droid carried on where it stopped, on claude-sonnet-4-6",
    )


async def test_a_failed_model_ends_the_turn_with_droids_error() -> None:
    broker = FakeBroker()

    async def droid_side(droid: FakeDroid) -> None:
        await start(droid)
        await droid.notify({"type": "error", "message": "401 invalid x-api-key"})
        await droid.notify(turn_completed("model_authentication_failed"))

    assert await talk(broker, droid_side) == (False, "401 invalid x-api-key")


async def test_a_subagents_turn_ending_is_not_the_tasks() -> None:
    broker = FakeBroker()

    async def droid_side(droid: FakeDroid) -> None:
        await start(droid)
        await droid.notify(turn_completed(), session="a-subagents-session")
        await droid.notify(created("assistant", {"type": "text", "text": "All of it done."}))
        await droid.notify(turn_completed())

    assert await talk(broker, droid_side) == (True, None)
    assert broker.shown()[-1] == ("summary", "All of it done.")


async def test_droid_gone_mid_turn_is_not_finished() -> None:
    broker = FakeBroker()

    async def droid_side(droid: FakeDroid) -> None:
        await start(droid)
        await droid.notify(created("assistant", {"type": "text", "text": "Half way."}))
        droid.close()

    assert await talk(broker, droid_side) == (False, None)
    assert broker.shown()[-1] == ("message", "Half way.")


async def test_a_plan_task_starts_in_spec_mode() -> None:
    broker = FakeBroker()

    async def droid_side(droid: FakeDroid) -> None:
        request = await droid.expect("droid.initialize_session")
        assert request["params"]["interactionMode"] == "spec"
        await droid.respond(request, {"sessionId": SESSION})
        await droid.respond(await droid.expect("droid.add_user_message"), {})
        await droid.notify(turn_completed())

    assert await talk(broker, droid_side, plan=True) == (True, None)
