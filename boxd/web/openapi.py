"""`GET /api/openapi.json`: the HTTP API as an OpenAPI 3.1 document.

Bodies and answers are the pydantic models the gateway and the manager check them with, so the
document cannot drift from what is enforced; the table below names each route's body, answer,
statuses and the fixed words of its refusals. A unit test holds it to make_app's routes.
"""

from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from boxd.errors import NO_ROOM_TO_START
from boxd.reading.strict_json import TOO_LARGE
from boxd.web.byte_ranges import past_the_end
from boxd.web.event_stream import EVENTS_PATH, HEARTBEAT_SECONDS
from boxd.web.host_check import OTHER_ORIGIN
from boxd.web.live_events import TOO_MANY
from boxd.web.openapi_doctor import DOCTOR, DOCTOR_SUMMARY, NOT_SANDBOXED, NOT_SANDBOXED_WHY
from boxd.web.openapi_files import FILE, FILE_MEDIA, FILE_SUMMARY, HISTORY, LISTING, READERS
from boxd.web.openapi_installs import INSTALL, INSTALLS
from boxd.web.openapi_uploads import ADD_MANY, ADD_UNDER, DELETE_ONE, MANY, ONE, PUT_ONE, RENAME
from boxd.web.screen_session import (
    NO_TOKEN,
    SESSION_ENDED,
    SESSION_PATH,
    SessionRequest,
)
from boxd.wire.caller import LINK_USED, OWNER_ONLY
from boxd.wire.models.approval_record import Answer, Approval
from boxd.wire.models.owner_requests import (
    NewPairing,
    NewToken,
    NewWorkspace,
    PairRequest,
    RenameRequest,
    SecretValue,
    SettingsChanges,
)
from boxd.wire.models.settings import Settings
from boxd.wire.models.task import Task
from boxd.wire.models.task_diff import TaskDiff
from boxd.wire.models.task_request import TaskRequest
from boxd.wire.models.token_limits import TokenLimits
from boxd.wire.screen_link import SCREEN_ADDRESS

OPENAPI_PATH = "/api/openapi.json"
_Mode = Literal["validation", "serialization"]
_MODELS: tuple[tuple[type[BaseModel], _Mode], ...] = (
    (TaskRequest, "validation"),
    (Answer, "validation"),
    (NewWorkspace, "validation"),
    (PairRequest, "validation"),
    (SettingsChanges, "validation"),
    (SecretValue, "validation"),
    (NewPairing, "validation"),
    (SessionRequest, "validation"),
    (NewToken, "validation"),
    (RenameRequest, "validation"),
    (Settings, "serialization"),
    (Task, "serialization"),
    (Approval, "serialization"),
    (TaskDiff, "serialization"),
)


def _ref(model: type[BaseModel]) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _list_of(model: type[BaseModel]) -> dict[str, Any]:
    return {"type": "array", "items": _ref(model)}


_TASK_WITH_STEPS: dict[str, Any] = {
    "allOf": [
        _ref(Task),
        {
            "type": "object",
            "properties": {
                "steps": {
                    "type": "array",
                    "description": "the task's story, oldest first",
                    "items": {"type": "object"},
                }
            },
        },
    ]
}
_WORKSPACE: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}},
}
_TOKEN: dict[str, Any] = {
    "type": "object",
    "required": ["id", "name", "role", "createdAt"],
    "properties": {
        "id": {"type": "string", "description": "the first 12 hex digits of its hash"},
        "name": {"type": "string"},
        "role": {"type": "string", "enum": ["owner", "app", "member", "device", "screen"]},
        "createdAt": {"type": "number"},
        "createdBy": {"type": "string"},
        "limits": {
            **_ref(TokenLimits),
            "description": "an app's or a member's token: what its tasks may have",
        },
    },
}
_PAUSED: dict[str, Any] = {
    "type": "object",
    "required": ["paused"],
    "properties": {"paused": {"type": "boolean"}},
}
_DEVICE_TOKEN: dict[str, Any] = {
    "type": "object",
    "required": ["device", "token"],
    "properties": {"device": {"type": "string"}, "token": {"type": "string"}},
}


_SECRET: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}},
}
_PAIRING: dict[str, Any] = {
    "type": "object",
    "required": ["device", "code", "expiresInSeconds", "qrSvg"],
    "properties": {
        "device": {"type": "string"},
        "code": {"type": "string", "description": "what the device sends to POST /api/pair"},
        "expiresInSeconds": {"type": "integer", "description": "how long the code is good"},
        "qrSvg": {"type": "string", "description": "an SVG element: the code as a QR code"},
    },
}
_SESSION: dict[str, Any] = {
    "type": "object",
    "required": ["session", "expiresInSeconds"],
    "properties": {
        "session": {
            "type": "string",
            "description": "sent as Authorization: Bearer; the page keeps it in sessionStorage",
        },
        "expiresInSeconds": {"type": "integer", "description": "how long the session lasts"},
    },
}
_LIVE_EVENTS = (
    "Server-Sent Events, each's data JSON: `step` {task, event: {kind, seq, at, data}}, a task's "
    "new step; `task` {task, changed: {D-Bus property: value}}, a task's properties changed, "
    "with `new: true` (and all its properties) when a task appears; `approval`, an approval "
    "asked for, as GET /api/approvals shows it; `end` {error}, the last one when the session or "
    f"token stopped being good. A comment line every {HEARTBEAT_SECONDS:.0f} seconds keeps the "
    "connection open."
)
_NOT_RUNNING = "boxd is not running (no one owns org.boxd.Box1 on the system bus)"
_IN_PERSON = "this computer's own screen or the owner's paired device (not an owner's token)"


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    summary: str
    status: int
    answer: dict[str, Any]
    body: type[BaseModel] | None = None
    # Statuses a caller may meet beside the usual ones (401, 403 from a token or the screen).
    refusals: tuple[int, ...] = ()
    who: str = "the owner: an owner's token or this computer's screen"
    open_to_all: bool = False
    # The answer's media type; an event stream's answer is described in words, not a schema.
    media: str = "application/json"
    # A body that is not a JSON model (an upload): its media types and their schemas.
    upload: dict[str, Any] | None = None


_APP_TOO = "the owner, or an app's or a member's token for the tasks it started"
# The workspace as it stands (boxd/web/workspace_files.py).
_FILES = "/api/workspaces/{name}"
_READ = (400, 404)
# The owner's changes (boxd/web/uploads.py), each answered with the change as a task.
_CHANGED = (201, _ref(Task))
_CHANGE = (400, 404, 507)
_OWNER_CHANGES: tuple[Route, ...] = (
    Route("PUT", f"{_FILES}/files/{{path}}", PUT_ONE, *_CHANGED, None, _CHANGE, upload=ONE),
    Route("POST", f"{_FILES}/files", ADD_MANY, *_CHANGED, None, _CHANGE, upload=MANY),
    Route("POST", f"{_FILES}/files/{{path}}", ADD_UNDER, *_CHANGED, None, _CHANGE, upload=MANY),
    Route("DELETE", f"{_FILES}/files/{{path}}", DELETE_ONE, *_CHANGED, None, _CHANGE),
    Route("POST", f"{_FILES}/rename", RENAME, *_CHANGED, RenameRequest, (*_CHANGE, 413)),
)
ROUTES: tuple[Route, ...] = (
    Route(
        "POST",
        "/api/tasks",
        "Start a task",
        201,
        _ref(Task),
        TaskRequest,
        (400, 413, 507),
        _APP_TOO,
    ),
    Route("GET", "/api/tasks", "The tasks, newest first", 200, _list_of(Task), who=_APP_TOO),
    Route(
        "GET",
        "/api/tasks/{id}",
        "A task and its steps",
        200,
        _TASK_WITH_STEPS,
        None,
        (404,),
        _APP_TOO,
    ),
    Route("POST", "/api/tasks/{id}/stop", "Stop a task", 200, _ref(Task), None, (404,), _APP_TOO),
    Route(
        "POST",
        "/api/tasks/{id}/undo",
        "Take a done task's changes out",
        200,
        _ref(Task),
        None,
        (400, 404),
    ),
    Route(
        "POST",
        "/api/tasks/{id}/keep",
        "Keep a personal-folder task's changes",
        200,
        _ref(Task),
        None,
        (400, 404),
    ),
    Route(
        "GET",
        "/api/tasks/{id}/diff",
        "Review what a task changed: each file added, changed or deleted, with a text diff",
        200,
        _ref(TaskDiff),
        None,
        (400, 404),
    ),
    Route(
        "GET", "/api/approvals", "What tasks wait for the owner to approve", 200, _list_of(Approval)
    ),
    Route(
        "POST",
        "/api/approvals/{id}",
        "Approve or deny",
        200,
        _ref(Approval),
        Answer,
        (400, 404, 413),
    ),
    Route("GET", "/api/workspaces", "The workspaces", 200, {"type": "array", "items": _WORKSPACE}),
    Route("POST", "/api/workspaces", "Make a workspace", 201, _WORKSPACE, NewWorkspace, (400, 413)),
    Route(
        "GET",
        "/api/tokens",
        "The tokens and the screen's sessions",
        200,
        {"type": "array", "items": _TOKEN},
    ),
    Route(
        "POST",
        "/api/tokens",
        "Make a token, with an app's or a member's limits; the answer holds it, shown once",
        201,
        {
            "type": "object",
            "required": ["token"],
            "properties": {"token": {"type": "string", "description": "send it as Bearer"}},
        },
        NewToken,
        (400, 413),
        who="this computer's own screen (and boxctl token create, over D-Bus)",
    ),
    Route(
        "DELETE",
        "/api/tokens/{id}",
        "Revoke a token or a screen's session",
        200,
        _TOKEN,
        None,
        (400, 404),
    ),
    *(Route("GET", path, summary, 200, INSTALL) for path, summary in INSTALLS),
    Route("GET", "/api/doctor", DOCTOR_SUMMARY, 200, DOCTOR),
    Route("GET", "/api/pause", "Whether the agents are paused", 200, _PAUSED),
    Route("POST", "/api/pause", "Pause the agents: new tasks stay queued", 200, _PAUSED),
    Route("POST", "/api/resume", "Resume: queued tasks start in the order they came", 200, _PAUSED),
    Route(
        "POST",
        "/api/pair",
        "Trade a pairing code (boxctl pair NAME) for a device's own token, once",
        201,
        _DEVICE_TOKEN,
        PairRequest,
        (400, 413),
        who="whoever holds a live pairing code",
        open_to_all=True,
    ),
    Route(
        "POST",
        SESSION_PATH,
        "Trade the code of boxctl open's one-time link for a session of this computer's screen",
        201,
        _SESSION,
        SessionRequest,
        (400, 413),
        who="whoever holds a live link from boxctl open",
        open_to_all=True,
    ),
    Route(
        "DELETE",
        SESSION_PATH,
        "Log out: the screen's session sent as the bearer token ends",
        200,
        {"type": "object", "required": ["ended"], "properties": {"ended": {"const": True}}},
        None,
        (404,),
        who="this computer's own screen, for its own session",
    ),
    Route(
        "GET",
        "/",
        "The owner's screen: a page that sends this computer's screen session with its requests",
        200,
        {"type": "string"},
        who="anyone (the page holds nothing; boxctl open logs in)",
        open_to_all=True,
        media="text/html",
    ),
    Route(
        "GET",
        "/screen/{name}",
        "The screen's own files (scripts, style, icon), as the wheel ships them",
        200,
        {"type": "string"},
        None,
        (404,),
        who="anyone",
        open_to_all=True,
        media="text/javascript",
    ),
    Route(
        "GET",
        EVENTS_PATH,
        "The box's live events, for the owner's screen",
        200,
        {"type": "string", "description": _LIVE_EVENTS},
        None,
        (503,),
        media="text/event-stream",
    ),
    Route("GET", "/api/settings", "The owner's settings", 200, _ref(Settings), who=_IN_PERSON),
    Route(
        "PATCH",
        "/api/settings",
        "Change some settings; the others stay",
        200,
        _ref(Settings),
        SettingsChanges,
        (400, 413),
        who=_IN_PERSON,
    ),
    Route(
        "GET",
        "/api/vault",
        "The vault's secrets (never a value): each one's name and whose it is, an app's "
        "(`<app>.<name>`: only that app's tools get it), the box's (`box`: a model key, for the "
        "model gateway only), or no one's (null: a name from before secrets had owners)",
        200,
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "belongsTo": {"type": ["string", "null"]},
                },
                "required": ["name", "belongsTo"],
            },
        },
        who=_IN_PERSON,
    ),
    Route(
        "PUT",
        "/api/vault/{name}",
        "Put a secret in the vault, or replace it",
        200,
        _SECRET,
        SecretValue,
        (400, 413),
        who=_IN_PERSON,
    ),
    Route(
        "DELETE",
        "/api/vault/{name}",
        "Remove a secret",
        200,
        _SECRET,
        None,
        (400, 404),
        who=_IN_PERSON,
    ),
    Route(
        "POST",
        "/api/pairings",
        "Make a pairing code for a device, with its QR code",
        201,
        _PAIRING,
        NewPairing,
        (400, 413),
        who=_IN_PERSON,
    ),
    Route(
        "DELETE",
        "/api/workspaces/{name}",
        "Remove a workspace (to the box's trash)",
        200,
        {
            "type": "object",
            "required": ["name", "trash"],
            "properties": {"name": {"type": "string"}, "trash": {"type": "string"}},
        },
        None,
        (400, 404),
        who=_IN_PERSON,
    ),
    *(
        Route(
            "GET",
            path,
            f"{what} as a tar (pax; sparse files in PAX sparse 1.0), sent as it is made: links as "
            "links, FIFOs, sockets and devices left out; an attachment named "
            f"{named} whose entries are under one folder of that name",
            200,
            {"type": "string", "contentMediaType": "application/x-tar"},
            None,
            (400, 404, 503),
            who="the owner, or an app's or a member's token for the workspaces its limits name",
            media="application/x-tar",
        )
        for path, what, named in (
            ("/api/workspaces/{name}/archive", "The whole workspace as it stands", "<name>.tar"),
            (
                "/api/workspaces/{name}/archive/{path}",
                "A folder of the workspace as it stands",
                "<name>-<the folder's last name>.tar",
            ),
        )
    ),
    Route("GET", f"{_FILES}/list", "A workspace's top folder", 200, LISTING, None, _READ, READERS),
    Route("GET", f"{_FILES}/list/{{path}}", "A folder", 200, LISTING, None, _READ, READERS),
    Route(
        "GET",
        f"{_FILES}/files/{{path}}",
        FILE_SUMMARY,
        200,
        FILE,
        None,
        (*_READ, 416),
        READERS,
        media=FILE_MEDIA,
    ),
    Route(
        "GET",
        f"{_FILES}/history/{{path}}",
        "The tasks that touched a path, newest first",
        200,
        HISTORY,
        None,
        _READ,
        READERS,
    ),
    *_OWNER_CHANGES,
    Route(
        "GET",
        OPENAPI_PATH,
        "This document",
        200,
        {"type": "object"},
        who="anyone",
        open_to_all=True,
    ),
)


def _error(*texts: str) -> dict[str, Any]:
    examples = {f"e{n}": {"value": {"error": text}} for n, text in enumerate(texts, 1)}
    return {
        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}, "examples": examples}
    }


_REFUSALS: dict[int, tuple[str, dict[str, Any]]] = {
    400: (
        "The body or the request is not valid: the words name the field",
        _error("no workspace notes"),
    ),
    401: ("No token, or one the box does not know", _error(NO_TOKEN, SESSION_ENDED)),
    403: (
        "Not this caller's to do, or asked by a page of another origin",
        _error(
            OWNER_ONLY, OTHER_ORIGIN.format(own=SCREEN_ADDRESS, origin="'http://127.0.0.1:8080'")
        ),
    ),
    404: ("No such task, approval, workspace or token", _error("no task t3k9x2a1b2")),
    413: ("The body is over 10 MB", _error(TOO_LARGE)),
    416: (
        "The range starts past the file's end (Content-Range: bytes */size)",
        _error(past_the_end(10)),
    ),
    503: (
        "boxd is not running, or (for the live events) too many streams are open",
        _error(_NOT_RUNNING, TOO_MANY),
    ),
    507: (
        "The box's disk is full: nothing was made; free space and try again",
        _error(NO_ROOM_TO_START),
    ),
}


def _parameters(path: str) -> list[dict[str, Any]]:
    names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
    return [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names
    ]


def _operation(route: Route) -> dict[str, Any]:
    ok = {"description": "OK", "content": {route.media: {"schema": route.answer}}}
    responses: dict[str, Any] = {str(route.status): ok}
    statuses = [*route.refusals, 503] if route.open_to_all else [*route.refusals, 401, 403, 503]
    for status in sorted(set(statuses)):
        words, content = _REFUSALS[status]
        responses[str(status)] = {"description": words, "content": content}
    if route.path == "/api/tasks" and route.method == "POST":
        responses["503"] = {
            "description": NOT_SANDBOXED_WHY,
            "content": _error(_NOT_RUNNING, NOT_SANDBOXED),
        }
    if route.path == SESSION_PATH and route.method == "POST":
        responses["401"] = {
            "description": "A used, late or unknown link",
            "content": _error(LINK_USED),
        }
    operation: dict[str, Any] = {
        "summary": route.summary,
        "description": f"Who may: {route.who}.",
        "responses": responses,
        "parameters": _parameters(route.path),
    }
    if not route.open_to_all:
        operation["security"] = [{"bearer": []}]
    if route.body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(route.body)}},
        }
    if route.upload is not None:
        operation["requestBody"] = {"required": True, "content": route.upload}
    return operation


@cache
def document() -> dict[str, Any]:
    _, top = models_json_schema(list(_MODELS), ref_template="#/components/schemas/{model}")
    schemas = dict(top["$defs"])
    schemas["Error"] = {
        "type": "object",
        "required": ["error"],
        "additionalProperties": False,
        "properties": {"error": {"type": "string", "description": "What went wrong"}},
    }
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {"title": "boxd", "version": "1", "description": "The box's HTTP API."},
        "servers": [{"url": SCREEN_ADDRESS}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": (
                        "a token, or this computer's screen's session (POST /api/session); "
                        "no cookie is ever read"
                    ),
                },
            },
        },
    }
