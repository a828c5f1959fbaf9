"""The gateway's fuzz tests' manager: a stand-in on a real bus that answers every method."""

import json
import re
from collections.abc import Callable
from typing import Any

from dbus_fast import Message, MessageType

from boxd.dbus.incoming_fds import guarded
from boxd.errors import BoxError, Problem, die
from boxd.manager.access import pairing, vault
from boxd.manager.access.tokens import token_role
from boxd.manager.workspaces import stack_view, workspaces
from boxd.reading.strict_json import loads
from boxd.wire.ids import check_task_id
from boxd.wire.models.settings import Settings, change_settings
from boxd.wire.models.task_request import parse_task_request
from boxd.wire.models.token_limits import parse_limits

OWNER = "box_owner"
TASK = {"id": "t000000001", "title": "t", "state": "queued"}


def _task(args: list[Any]) -> dict[str, Any]:
    check_task_id(args[0])
    return TASK


def _settings(args: list[Any]) -> dict[str, Any]:
    changes = loads(args[0], "the settings")
    if not isinstance(changes, dict):
        die(Problem.INVALID, "the settings must be a JSON object of names and values")
    return change_settings(Settings(), changes).model_dump(mode="json")


def _approval(args: list[Any]) -> dict[str, Any]:
    if not re.fullmatch(r"t[0-9a-z]{9}\.[^\x00]{1,200}", args[0]):
        die(Problem.NOT_FOUND, f"no approval {args[0][:80]}")
    return {"id": args[0], "state": "approved" if args[1] else "denied"}


def _read_workspace(args: list[Any]) -> Any:
    """The workspace reading doors: the path checked as the manager checks it, and then no
    workspace by that name (the stand-in has none to read)."""
    stack_view.checked(args[1])
    die(Problem.NOT_FOUND, f"there is no workspace {args[0][:80]!r}")


# The manager's answers by method, after its own checks on the arguments (token excluded).
ANSWERS: dict[str, Callable[[list[Any]], Any]] = {
    "CreateTask": lambda args: {**TASK, "title": parse_task_request(args[0]).title},
    "ListTasks": lambda args: {"tasks": [TASK]},
    "GetTask": lambda args: {**_task(args), "steps": []},
    "DiffTask": lambda args: {**_task(args), "files": []},
    "StopTask": _task,
    "UndoTask": _task,
    "KeepTask": _task,
    "ListApprovals": lambda args: {"approvals": []},
    "AnswerApproval": _approval,
    "ListWorkspaces": lambda args: [{"name": "home"}],
    "CreateWorkspace": lambda args: {"name": workspaces.check_name(args[0])},
    "RemoveWorkspace": lambda args: {"name": workspaces.check_name(args[0]), "trash": "/t"},
    "ListTokens": lambda args: [],
    "CreateToken": lambda args: (token_role(args[1]), parse_limits(args[2])) and "box_made",
    "RevokeToken": lambda args: die(Problem.NOT_FOUND, f"no token {args[0][:80]}"),
    "GetDroid": lambda args: {"state": "installed"},
    "GetAgents": lambda args: {"paused": False},
    "PauseAgents": lambda args: {"paused": True},
    "ResumeAgents": lambda args: {"paused": False},
    "Pair": lambda args: die(Problem.NOT_FOUND, pairing.WRONG),
    "GetSettings": lambda args: Settings().model_dump(mode="json"),
    "SetSettings": _settings,
    "ListSecrets": lambda args: [],
    "SetSecret": lambda args: {"name": vault.check_name(args[0])},
    "RemoveSecret": lambda args: {"name": vault.check_name(args[0])},
    "CreatePairing": lambda args: {
        "device": pairing.check_device_name(args[0]),
        "code": "ABCDE-FGHIJ",
        "expiresInSeconds": 600,
    },
    "OpenScreenSession": lambda args: die(Problem.UNAUTHORIZED, "that link was used already"),
    "CloseScreenSession": lambda args: {"ended": True},
    "ListWorkspaceFiles": _read_workspace,
    "GetWorkspaceFileHistory": _read_workspace,
    "OpenWorkspaceFile": _read_workspace,
    "OpenWorkspaceArchive": _read_workspace,
}


# Asked with what the caller holds instead of a token: a pairing code, a login link's code.
OPEN_TO_ALL = ("Pair", "OpenScreenSession")


def _reply(message: Message, answer: Any) -> Message:
    return Message(
        message_type=MessageType.METHOD_RETURN,
        reply_serial=1,
        signature="s",
        body=[json.dumps(answer)],
    )


def _error(message: Message, failure: BoxError) -> Message:
    return Message(
        message_type=MessageType.ERROR,
        reply_serial=1,
        error_name=failure.problem.dbus_name,
        signature="s",
        body=[failure.message],
    )


class ManagerOnTheBus:
    """The system bus with the manager on it, as the gateway's GatewayClient sees it."""

    def __init__(self) -> None:
        self.calls = 0
        self.serial = 0
        self.handlers: list[Callable[[Message], Any]] = []
        guarded(self)  # type: ignore[arg-type]  # as connect_system_bus(fds=True) guards one

    # What the guard of incoming descriptors (boxd.dbus.incoming_fds) asks of a connection.
    def add_message_handler(self, handler: Callable[[Message], Any]) -> None:
        self.handlers.append(handler)

    def next_serial(self) -> int:
        self.serial += 1
        return self.serial

    async def call(self, message: Message) -> Message:
        # What dbus-fast does to every message before it goes on the socket.
        message._marshall(False)
        self.calls += 1
        token, *args = message.body
        try:
            if token != OWNER and message.member not in OPEN_TO_ALL:
                die(Problem.UNAUTHORIZED, "a valid bearer token is required")
            return _reply(message, ANSWERS[str(message.member)](args))
        except BoxError as failure:
            return _error(message, failure)
