"""The gateway's fuzz tests' manager: a stand-in on a real bus that answers every method."""

import json
import os
import re
from collections.abc import Callable
from typing import Any, cast

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


def _workspace(args: list[Any]) -> dict[str, Any]:
    """A workspace's path, checked as the manager checks it; only `home` is there."""
    if args[0] != "home":
        die(Problem.NOT_FOUND, f"there is no workspace {args[0][:80]!r}")
    stack_view.checked(args[1])
    return {"workspace": args[0], "path": args[1]}


def _file(args: list[Any]) -> dict[str, Any]:
    found = _workspace(args)
    if not args[1]:
        die(Problem.INVALID, "the workspace itself is a folder, not a plain file")
    return {**found, "size": 0, "modified": "2026-01-01T00:00:00Z", "task": None}


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
    "AddToWorkspace": lambda args: (
        (workspaces.check_name(args[0]), stack_view.checked(args[1])) and TASK
    ),
    "DeleteFromWorkspace": lambda args: (
        (
            workspaces.check_name(args[0]),
            stack_view.checked(args[1]) or die(Problem.INVALID, "name a path"),
        )
        and TASK
    ),
    "RenameInWorkspace": lambda args: (
        (
            workspaces.check_name(args[0]),
            stack_view.checked(args[1]),
            stack_view.checked(args[2]),
        )
        and TASK
    ),
    "ListTokens": lambda args: [],
    "CreateToken": lambda args: (token_role(args[1]), parse_limits(args[2])) and "box_made",
    "RevokeToken": lambda args: die(Problem.NOT_FOUND, f"no token {args[0][:80]}"),
    "GetDroid": lambda args: {"state": "installed"},
    "GetClaude": lambda args: {"state": "installed"},
    "CheckMachine": lambda args: {"tasksStart": True, "checks": []},
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
    "ListWorkspaceFiles": lambda args: {**_workspace(args), "entries": [], "truncated": False},
    "GetWorkspaceFileHistory": lambda args: {**_workspace(args), "tasks": [], "inBase": True},
    "OpenWorkspaceFile": _file,
    "OpenWorkspaceArchive": lambda args: {**_workspace(args), "filename": "home.tar"},
    "OpenScreenSession": lambda args: die(Problem.UNAUTHORIZED, "that link was used already"),
    "CloseScreenSession": lambda args: {"ended": True},
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
        self._serial = 0
        self._handlers: list[Callable[[Message], Any]] = []
        # As the gateway's own connection: every descriptor that comes in is guarded.
        guarded(cast(Any, self))

    def add_message_handler(self, handler: Callable[[Message], Any]) -> None:
        self._handlers.append(handler)

    def next_serial(self) -> int:
        self._serial += 1
        return self._serial

    async def call(self, message: Message) -> Message:
        # What dbus-fast does to every message before it goes on the socket.
        message._marshall(False)
        self.calls += 1
        token, *args = message.body
        try:
            if token != OWNER and message.member not in OPEN_TO_ALL:
                die(Problem.UNAUTHORIZED, "a valid bearer token is required")
            answer = ANSWERS[str(message.member)](args)
        except BoxError as failure:
            return _error(message, failure)
        if message.member not in ("OpenWorkspaceFile", "OpenWorkspaceArchive"):
            return _reply(message, answer)
        # A descriptor, as the bus brings it: through the handlers first (boxd.dbus.incoming_fds).
        reply = Message(
            message_type=MessageType.METHOD_RETURN,
            reply_serial=message.serial,
            signature="hs",
            body=[0, json.dumps(answer)],
            unix_fds=[os.open("/dev/null", os.O_RDONLY)],
        )
        for handler in self._handlers:
            handler(reply)
        return reply
