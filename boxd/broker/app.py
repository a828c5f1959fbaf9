"""The broker API of broker-api.txt, over HTTP on the task's socket."""

import json
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from pydantic import ValidationError

from boxd.broker.syncfs import syncfs
from boxd.errors import Problem
from boxd.json_errors import MAX_BODY, json_errors
from boxd.plain_errors import invalid
from boxd.step import Step


class Manager(Protocol):
    """The manager's log, as the broker reaches it (boxd.broker.manager_link over D-Bus)."""

    async def call(self, member: str, *args: str) -> Any: ...


MANAGER = web.AppKey("manager", Manager)
TASK_DIR = web.AppKey("task_dir", Path)


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
    # Errors are 400 as broker-api.txt says; 503 only while the manager is away.
    errors = json_errors(
        lambda failure: 503 if failure.problem == Problem.UNAVAILABLE else 400,
        "this broker serves GET /task, GET /tools and POST /step",
    )
    app = web.Application(middlewares=[errors], client_max_size=MAX_BODY)
    app[MANAGER] = manager
    app[TASK_DIR] = task_dir
    app.router.add_get("/task", get_task)
    app.router.add_get("/tools", get_tools)
    app.router.add_post("/step", post_step)
    return app
