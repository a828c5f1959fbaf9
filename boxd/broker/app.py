"""The broker API of broker-api.txt, over HTTP on the task's socket."""

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from pydantic import ValidationError

from boxd.broker.syncfs import syncfs
from boxd.errors import BoxError, Problem
from boxd.plain_errors import invalid
from boxd.step import Step


class Manager(Protocol):
    """The manager's log, as the broker reaches it (boxd.broker.manager_link over D-Bus)."""

    async def call(self, member: str, *args: str) -> Any: ...


MANAGER = web.AppKey("manager", Manager)
TASK_DIR = web.AppKey("task_dir", Path)
MAX_BODY = 10 * 1024 * 1024


def error(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def plain_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except BoxError as failure:
        status = 503 if failure.problem == Problem.UNAVAILABLE else 400
        return error(failure.message, status)
    except web.HTTPRequestEntityTooLarge:
        return error("the body is over 10 MB", 413)
    except web.HTTPNotFound:
        return error(
            f"no such request: {request.method} {request.path}; "
            "this broker serves GET /task, GET /tools and POST /step",
            404,
        )
    except web.HTTPMethodNotAllowed:
        return error(f"{request.path} does not take {request.method}", 405)


async def get_task(request: web.Request) -> web.Response:
    return web.json_response(await request.app[MANAGER].call("GetTask"))


async def get_tools(request: web.Request) -> web.Response:
    # No apps are installed yet, so a task may call no tools.
    return web.json_response([])


async def post_step(request: web.Request) -> web.Response:
    body = await request.read()
    try:
        step = Step.model_validate_json(body or b"null")
    except ValidationError as failure:
        raise invalid(failure) from None
    # The step is logged only once the task's files are on disk.
    await syncfs(request.app[TASK_DIR])
    event = await request.app[MANAGER].call("LogStep", json.dumps(step.model_dump(mode="json")))
    return web.json_response(event)


def make_app(manager: Manager, task_dir: Path) -> web.Application:
    app = web.Application(middlewares=[plain_errors], client_max_size=MAX_BODY)
    app[MANAGER] = manager
    app[TASK_DIR] = task_dir
    app.router.add_get("/task", get_task)
    app.router.add_get("/tools", get_tools)
    app.router.add_post("/step", post_step)
    return app
