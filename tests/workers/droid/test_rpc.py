"""The JSON-RPC client of `droid exec --input-format stream-jsonrpc`, against a fake Droid on
real pipes (tests/support/droid_fixtures.py)."""

import asyncio

import pytest

from boxd.workers.droid.rpc import (
    ASK_USER,
    REQUEST_PERMISSION,
    DroidRpcError,
    PermissionRequest,
    Question,
)
from tests.support.droid_fixtures import (
    SESSION,
    ask_user_params,
    connected,
    exec_permission_params,
    turn_completed,
)


class Scripted:
    """An answerer that says what a test tells it to and remembers what it was asked."""

    def __init__(self, answers: list[str] | None = None, option: str = "cancel") -> None:
        self.questions: list[tuple[Question, ...]] = []
        self.permissions: list[PermissionRequest] = []
        self._answers = answers or []
        self._option = option

    async def ask_user(self, questions: tuple[Question, ...]) -> list[str]:
        self.questions.append(questions)
        return self._answers[: len(questions)]

    async def permission(self, request: PermissionRequest) -> str:
        self.permissions.append(request)
        return self._option


class Broken(Scripted):
    async def ask_user(self, questions: tuple[Question, ...]) -> list[str]:
        raise ValueError("the broker is gone")


async def test_a_session_starts_with_the_tasks_model_autonomy_and_folder() -> None:
    rpc, droid = await connected(Scripted())
    serving = asyncio.create_task(rpc.serve())
    starting = asyncio.create_task(
        rpc.initialize_session(
            title="Summarise the notes",
            cwd="/w",
            model="custom:Box-0",
            autonomy="medium",
            spec=True,
            disabled=("Task",),
        )
    )
    request = await droid.expect("droid.initialize_session")
    assert request["params"] == {
        "machineId": "box",
        "title": "Summarise the notes",
        "cwd": "/w",
        "modelId": "custom:Box-0",
        "autonomyLevel": "medium",
        "interactionMode": "spec",
        "disabledToolIds": ["Task"],
    }
    await droid.respond(request, {"sessionId": SESSION, "session": {"messages": []}})
    assert (await starting)["sessionId"] == SESSION
    droid.close()
    await serving


async def test_a_loaded_session_gets_the_tasks_settings_again() -> None:
    rpc, droid = await connected(Scripted())
    serving = asyncio.create_task(rpc.serve())
    loading = asyncio.create_task(rpc.load_session(SESSION, autonomy="low", disabled=("Task",)))
    request = await droid.expect("droid.load_session")
    assert request["params"] == {"sessionId": SESSION, "disabledToolIds": ["Task"]}
    await droid.respond(request, {"session": {"messages": []}})
    settings = await droid.expect("droid.update_session_settings")
    assert settings["params"] == {
        "autonomyLevel": "low",
        "interactionMode": "auto",
        "disabledToolIds": ["Task"],
    }
    await droid.respond(settings, {})
    await loading
    droid.close()
    await serving


async def test_an_error_answer_is_raised_in_droids_words() -> None:
    rpc, droid = await connected(Scripted())
    serving = asyncio.create_task(rpc.serve())
    sending = asyncio.create_task(rpc.add_user_message("hi"))
    request = await droid.expect("droid.add_user_message")
    await droid.fail(request, "Invalid request format", "No active session")
    with pytest.raises(DroidRpcError, match="Invalid request format: No active session"):
        await sending
    droid.close()
    await serving


async def test_a_request_droid_never_answers_fails_when_droid_stops() -> None:
    rpc, droid = await connected(Scripted())
    serving = asyncio.create_task(rpc.serve())
    sending = asyncio.create_task(rpc.add_user_message("hi"))
    await droid.expect("droid.add_user_message")
    droid.close()
    with pytest.raises(DroidRpcError, match="Droid stopped before it answered"):
        await sending
    await serving
    with pytest.raises(DroidRpcError, match=r"stopped before droid\.add_user_message"):
        await rpc.add_user_message("again")


async def test_notifications_come_out_in_order_with_their_session_then_none() -> None:
    rpc, droid = await connected(Scripted())
    serving = asyncio.create_task(rpc.serve())
    await droid.notify({"type": "droid_working_state_changed", "newState": "thinking"})
    await droid.say(b"Droid prints a line that is not JSON\n")
    # Some notifications name no session (tool_call, permission_resolved).
    await droid.notify({"type": "tool_call", "toolUse": {"name": "Create"}}, session=None)
    await droid.notify(turn_completed())
    droid.close()
    first = await rpc.notification()
    assert first == {
        "type": "droid_working_state_changed",
        "newState": "thinking",
        "sessionId": SESSION,
    }
    second = await rpc.notification()
    assert second is not None and second["type"] == "tool_call" and second["sessionId"] is None
    third = await rpc.notification()
    assert third is not None and third["type"] == "agent_turn_completed"
    assert await rpc.notification() is None
    await serving


async def test_ask_user_is_answered_per_question_with_droids_own_indexes() -> None:
    answerer = Scripted(answers=["Yes: approved", "No: not approved"])
    rpc, droid = await connected(answerer)
    serving = asyncio.create_task(rpc.serve())
    answer = await droid.ask(
        ASK_USER,
        ask_user_params(("Should it be red?", ["Yes", "No"]), ("Round?", ["Yes", "No"])),
    )
    assert answer["result"] == {
        "answers": [
            {"index": 1, "question": "Should it be red?", "answer": "Yes: approved"},
            {"index": 2, "question": "Round?", "answer": "No: not approved"},
        ]
    }
    (questions,) = answerer.questions
    assert questions[0] == Question(
        index=1, question="Should it be red?", topic="Colour", options=("Yes", "No"), multi=False
    )
    droid.close()
    await serving


async def test_a_permission_is_answered_with_the_option_chosen() -> None:
    answerer = Scripted(option="cancel")
    rpc, droid = await connected(answerer)
    serving = asyncio.create_task(rpc.serve())
    answer = await droid.ask(REQUEST_PERMISSION, exec_permission_params("rm -rf build"))
    assert answer["result"] == {"selectedOption": "cancel"}
    (request,) = answerer.permissions
    assert request.options == ("proceed_once", "proceed_always", "cancel")
    (use,) = request.tool_uses
    assert (use.name, use.kind, use.details["fullCommand"]) == ("Execute", "exec", "rm -rf build")
    droid.close()
    await serving


async def test_a_question_the_worker_cannot_answer_is_an_error_droid_reads_as_cancelled() -> None:
    rpc, droid = await connected(Broken())
    serving = asyncio.create_task(rpc.serve())
    answer = await droid.ask(ASK_USER, ask_user_params(("Red?", ["Yes", "No"])))
    assert answer["error"]["message"] == "the broker is gone"
    assert "result" not in answer
    droid.close()
    await serving


async def test_a_request_the_box_does_not_know_is_refused_by_name() -> None:
    rpc, droid = await connected(Scripted())
    serving = asyncio.create_task(rpc.serve())
    answer = await droid.ask("droid.something_new", {})
    assert answer["error"] == {
        "code": -32601,
        "message": "the box does not answer droid.something_new",
    }
    droid.close()
    await serving


async def test_droid_is_read_while_a_question_waits_for_its_answer() -> None:
    """An owner may take hours: notifications still flow while AskUser waits."""
    release = asyncio.Event()

    class Slow(Scripted):
        async def ask_user(self, questions: tuple[Question, ...]) -> list[str]:
            await release.wait()
            return ["Yes"]

    rpc, droid = await connected(Slow())
    serving = asyncio.create_task(rpc.serve())
    asking = asyncio.create_task(droid.ask(ASK_USER, ask_user_params(("Red?", ["Yes", "No"]))))
    await droid.notify({"type": "droid_working_state_changed", "newState": "waiting_for_user"})
    seen = await rpc.notification()
    assert seen is not None and seen["newState"] == "waiting_for_user"
    assert not asking.done()
    release.set()
    answer = await asking
    assert answer["result"]["answers"][0]["answer"] == "Yes"
    droid.close()
    await serving


async def test_a_question_nobody_can_hear_the_answer_to_stops_being_asked() -> None:
    """Droid gone: the worker stops asking the broker; the approval stays there, by its key."""
    asking = asyncio.Event()
    stopped = asyncio.Event()

    class Waiting(Scripted):
        async def ask_user(self, questions: tuple[Question, ...]) -> list[str]:
            asking.set()
            try:
                await asyncio.Event().wait()
            finally:
                stopped.set()
            return []

    rpc, droid = await connected(Waiting())
    serving = asyncio.create_task(rpc.serve())
    await droid.send(
        {
            "type": "request",
            "method": ASK_USER,
            "id": "q-1",
            "params": ask_user_params(("Red?", [])),
        }
    )
    await asking.wait()
    droid.close()
    await serving
    await stopped.wait()
