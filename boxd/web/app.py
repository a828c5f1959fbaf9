"""Routes of the HTTP API. Every decision is the manager's: the gateway forwards the bearer
token and the body as they came, and turns the manager's problem codes into statuses."""

from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from boxd.dbus import interface as api
from boxd.dbus.client import GatewayClient, connect_system_bus, pages
from boxd.doors.connection_guard import streams_body
from boxd.doors.json_errors import MAX_BODY, json_errors
from boxd.errors import Problem, die
from boxd.web import uploads, workspace_files
from boxd.web.archive_download import download_archive
from boxd.web.event_stream import EVENTS_PATH, Timing, serve_events
from boxd.web.host_check import only_own_names
from boxd.web.json_stream import stream
from boxd.web.live_events import LiveEvents
from boxd.web.openapi import OPENAPI_PATH, document
from boxd.web.screen_page import ScreenPage
from boxd.web.screen_session import (
    SESSION_PATH,
    close_session,
    open_session,
    screen_session,
    token_of,
)
from boxd.wire.models.approval_record import Answer
from boxd.wire.models.owner_requests import (
    NewPairing,
    NewToken,
    NewWorkspace,
    PairRequest,
    SecretValue,
    SettingsChanges,
)
from boxd.wire.models.plain_errors import parse
from boxd.wire.pairing_qr import qr_svg

CLIENT = web.AppKey("client", GatewayClient)
EVENTS = web.AppKey("events", LiveEvents)
EVENT_TIMING = web.AppKey("event timing", Timing)


def _json(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status)


async def _call(request: web.Request, method: api.Method, *args: str) -> Any:
    return await request.app[CLIENT].call_as(token_of(request), method, *args)


async def create_task(request: web.Request) -> web.Response:
    token = token_of(request)
    raw = await request.read()
    try:
        body = raw.decode("utf-8")
    except UnicodeDecodeError:
        die(Problem.INVALID, "the body is not UTF-8 text")
    return _json(await request.app[CLIENT].call_as(token, api.CREATE_TASK, body), 201)


def _pages(request: web.Request, method: api.Method, *args: str) -> AsyncIterator[dict[str, Any]]:
    """The pages of a long answer, asked for with the caller's token."""
    return pages(lambda page: _call(request, method, *args, page))


def _without(*names: str) -> Any:
    return lambda first: {k: v for k, v in first.items() if k not in names}


async def list_tasks(request: web.Request) -> web.StreamResponse:
    return await stream(request, _pages(request, api.LIST_TASKS), "tasks", lambda _: None)


async def get_task(request: web.Request) -> web.StreamResponse:
    task = _pages(request, api.GET_TASK, request.match_info["id"])
    return await stream(request, task, "steps", _without("steps", "next"))


async def diff_task(request: web.Request) -> web.StreamResponse:
    diff = _pages(request, api.DIFF_TASK, request.match_info["id"])
    return await stream(request, diff, "files", _without("files", "next"))


async def stop_task(request: web.Request) -> web.Response:
    return _json(await _call(request, api.STOP_TASK, request.match_info["id"]))


async def list_approvals(request: web.Request) -> web.StreamResponse:
    return await stream(request, _pages(request, api.LIST_APPROVALS), "approvals", lambda _: None)


async def answer_approval(request: web.Request) -> web.Response:
    token = token_of(request)
    answer = parse(Answer, await request.read())
    approval = await request.app[CLIENT].call_as(
        token, api.ANSWER_APPROVAL, request.match_info["id"], answer.approved
    )
    return _json(approval)


async def undo_task(request: web.Request) -> web.Response:
    return _json(await _call(request, api.UNDO_TASK, request.match_info["id"]))


async def keep_task(request: web.Request) -> web.Response:
    return _json(await _call(request, api.KEEP_TASK, request.match_info["id"]))


async def list_workspaces(request: web.Request) -> web.Response:
    return _json(await _call(request, api.LIST_WORKSPACES))


async def workspace_archive(request: web.Request) -> web.StreamResponse:
    return await download_archive(request, request.app[CLIENT])


async def create_workspace(request: web.Request) -> web.Response:
    token = token_of(request)
    body = parse(NewWorkspace, await request.read())
    return _json(await request.app[CLIENT].call_as(token, api.CREATE_WORKSPACE, body.name), 201)


async def list_tokens(request: web.Request) -> web.Response:
    return _json(await _call(request, api.LIST_TOKENS))


async def create_token(request: web.Request) -> web.Response:
    token = token_of(request)
    body = parse(NewToken, await request.read())
    made = await request.app[CLIENT].call_as(
        token, api.CREATE_TOKEN, body.name, body.role, body.limits_json()
    )
    return _json({"token": made}, 201)


async def revoke_token(request: web.Request) -> web.Response:
    return _json(await _call(request, api.REVOKE_TOKEN, request.match_info["id"]))


async def get_droid(request: web.Request) -> web.Response:
    return _json(await _call(request, api.GET_DROID))


async def get_claude(request: web.Request) -> web.Response:
    return _json(await _call(request, api.GET_CLAUDE))


async def check_machine(request: web.Request) -> web.Response:
    return _json(await _call(request, api.CHECK_MACHINE))


async def pair(request: web.Request) -> web.Response:
    """No token: the pairing code is the device's only credential, checked by the manager."""
    body = parse(PairRequest, await request.read())
    return _json(await request.app[CLIENT].call_as("", api.PAIR, body.code), 201)


async def get_pause(request: web.Request) -> web.Response:
    return _json(await _call(request, api.GET_AGENTS))


async def pause_agents(request: web.Request) -> web.Response:
    return _json(await _call(request, api.PAUSE_AGENTS))


async def resume_agents(request: web.Request) -> web.Response:
    return _json(await _call(request, api.RESUME_AGENTS))


async def live_events(request: web.Request) -> web.StreamResponse:
    app = request.app
    return await serve_events(
        request, app[CLIENT], app[EVENTS], token_of(request), app[EVENT_TIMING]
    )


async def get_settings(request: web.Request) -> web.Response:
    return _json(await _call(request, api.GET_SETTINGS))


async def change_settings(request: web.Request) -> web.Response:
    token = token_of(request)
    changes = parse(SettingsChanges, await request.read())
    return _json(
        await request.app[CLIENT].call_as(token, api.SET_SETTINGS, changes.model_dump_json())
    )


async def list_secrets(request: web.Request) -> web.Response:
    return _json(await _call(request, api.LIST_SECRETS))


async def set_secret(request: web.Request) -> web.Response:
    token = token_of(request)
    body = parse(SecretValue, await request.read())
    name = request.match_info["name"]
    return _json(await request.app[CLIENT].call_as(token, api.SET_SECRET, name, body.value))


async def remove_secret(request: web.Request) -> web.Response:
    return _json(await _call(request, api.REMOVE_SECRET, request.match_info["name"]))


async def create_pairing(request: web.Request) -> web.Response:
    token = token_of(request)
    body = parse(NewPairing, await request.read())
    pairing = await request.app[CLIENT].call_as(token, api.CREATE_PAIRING, body.name)
    return _json({**pairing, "qrSvg": qr_svg(pairing["code"])}, 201)


async def remove_workspace(request: web.Request) -> web.Response:
    return _json(await _call(request, api.REMOVE_WORKSPACE, request.match_info["name"]))


@streams_body
async def put_workspace_file(request: web.Request) -> web.Response:
    return await uploads.put_file(request.app[CLIENT], uploads.add_to_workspace, request)


@streams_body
async def post_workspace_files(request: web.Request) -> web.Response:
    return await uploads.post_files(request.app[CLIENT], uploads.add_to_workspace, request)


async def delete_workspace_file(request: web.Request) -> web.Response:
    return await uploads.delete_file(request.app[CLIENT], request)


async def rename_in_workspace(request: web.Request) -> web.Response:
    return await uploads.rename(request.app[CLIENT], request)


async def login(request: web.Request) -> web.Response:
    return await open_session(request.app[CLIENT], request)


async def logout(request: web.Request) -> web.Response:
    return await close_session(request.app[CLIENT], request)


async def openapi(request: web.Request) -> web.Response:
    return _json(document())


async def _bus(app: web.Application) -> AsyncIterator[None]:
    bus = await connect_system_bus(fds=True)
    app[CLIENT] = GatewayClient(bus)
    await app[EVENTS].start(bus)
    yield
    bus.disconnect()


def make_app(
    client: GatewayClient | None = None,
    events: LiveEvents | None = None,
    event_timing: Timing | None = None,
) -> web.Application:
    """The gateway; `client` stands for the system bus's manager where a test brings its own,
    and `events` for the signals it hears (started by the test)."""
    errors = json_errors(
        lambda failure: failure.problem.http_status,
        "the API serves GET and POST /api/tasks, GET /api/tasks/{id}, "
        "GET /api/tasks/{id}/diff, POST /api/tasks/{id}/stop, /undo and /keep, "
        "GET /api/approvals, POST /api/approvals/{id}, "
        "GET and POST /api/workspaces, GET and POST /api/tokens, DELETE /api/tokens/{id}, "
        "GET /api/droid, GET /api/claude, GET /api/doctor, "
        "GET and POST /api/pause, POST /api/resume, POST /api/pair, "
        "POST and DELETE /api/session (boxctl open makes the link), GET /api/openapi.json, "
        "GET /api/events, GET and PATCH /api/settings, GET /api/vault, "
        "PUT and DELETE /api/vault/{name}, POST /api/pairings, DELETE /api/workspaces/{name}, "
        "GET /api/workspaces/{name}/list[/{path}], /files/{path} and /history/{path}, "
        "PUT and DELETE /api/workspaces/{name}/files/{path}, "
        "POST /api/workspaces/{name}/files[/{folder}], POST /api/workspaces/{name}/rename, "
        "and the owner's screen at /",
    )
    app = web.Application(
        middlewares=[errors, only_own_names, screen_session], client_max_size=MAX_BODY
    )
    if client is None:
        app.cleanup_ctx.append(_bus)
    else:
        app[CLIENT] = client
    app[EVENTS] = events or LiveEvents()
    app[EVENT_TIMING] = event_timing or Timing()
    app.router.add_post("/api/tasks", create_task)
    app.router.add_get("/api/tasks", list_tasks)
    app.router.add_get("/api/tasks/{id}", get_task)
    app.router.add_post("/api/tasks/{id}/stop", stop_task)
    app.router.add_post("/api/tasks/{id}/undo", undo_task)
    app.router.add_post("/api/tasks/{id}/keep", keep_task)
    app.router.add_get("/api/tasks/{id}/diff", diff_task)
    app.router.add_get("/api/approvals", list_approvals)
    app.router.add_get("/api/workspaces", list_workspaces)
    app.router.add_post("/api/workspaces", create_workspace)
    app.router.add_post("/api/approvals/{id}", answer_approval)
    app.router.add_get("/api/tokens", list_tokens)
    app.router.add_post("/api/tokens", create_token)
    app.router.add_delete("/api/tokens/{id}", revoke_token)
    app.router.add_get("/api/droid", get_droid)
    app.router.add_get("/api/claude", get_claude)
    app.router.add_get("/api/doctor", check_machine)
    app.router.add_get("/api/pause", get_pause)
    app.router.add_post("/api/pause", pause_agents)
    app.router.add_post("/api/resume", resume_agents)
    app.router.add_post("/api/pair", pair)
    app.router.add_post(SESSION_PATH, login)
    app.router.add_delete(SESSION_PATH, logout)
    app.router.add_get(OPENAPI_PATH, openapi)
    app.router.add_get(EVENTS_PATH, live_events)
    app.router.add_get("/api/settings", get_settings)
    app.router.add_patch("/api/settings", change_settings)
    app.router.add_get("/api/vault", list_secrets)
    app.router.add_put("/api/vault/{name}", set_secret)
    app.router.add_delete("/api/vault/{name}", remove_secret)
    app.router.add_post("/api/pairings", create_pairing)
    app.router.add_delete("/api/workspaces/{name}", remove_workspace)
    app.router.add_get("/api/workspaces/{name}/archive", workspace_archive)
    app.router.add_get("/api/workspaces/{name}/archive/{path:.+}", workspace_archive)
    workspace_files.add_routes(app.router, lambda request: request.app[CLIENT])
    app.router.add_put("/api/workspaces/{name}/files/{path:.+}", put_workspace_file)
    app.router.add_delete("/api/workspaces/{name}/files/{path:.+}", delete_workspace_file)
    app.router.add_post("/api/workspaces/{name}/files", post_workspace_files)
    app.router.add_post("/api/workspaces/{name}/files/{path:.+}", post_workspace_files)
    app.router.add_post("/api/workspaces/{name}/rename", rename_in_workspace)
    ScreenPage().add_routes(app.router)
    return app
