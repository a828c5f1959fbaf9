"""The broker API of broker-api.txt, over HTTP on the task's socket."""

import json
from pathlib import Path
from typing import Annotated, Any

from aiohttp import web
from pydantic import BaseModel, BeforeValidator, ConfigDict

from boxd.approval import ApprovalState, AskRequest
from boxd.apps.registry import find_tool
from boxd.broker.calls import Calls
from boxd.broker.manager_link import Manager, Waiter
from boxd.caps import MAX_LABEL, cents, text
from boxd.dbus.client import pages
from boxd.errors import Problem
from boxd.json_errors import MAX_BODY, json_errors
from boxd.json_pages import stream
from boxd.plain_errors import parse
from boxd.pricing import Tokens, price_cents
from boxd.step import Step

MANAGER = web.AppKey("manager", Manager)
WAITER = web.AppKey("waiter", Waiter)
CALLS = web.AppKey("calls", Calls)
TASK = web.AppKey("task", dict[str, Any])
TASK_DIR = web.AppKey("task_dir", Path)
WAIT_SECONDS = web.AppKey("wait_seconds", float)


class CostRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cents: Annotated[float, BeforeValidator(lambda v: cents(v, "cents"))]
    what: Annotated[str, text("what", MAX_LABEL)]


class UsageRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, text("model", MAX_LABEL)]
    tokens: Tokens
    what: Annotated[str, text("what", MAX_LABEL)] = "model"


# Refusals that say "nothing was done; ask again later" rather than "this request is wrong".
_AGAIN = (Problem.UNAVAILABLE, Problem.FULL)


async def get_task(request: web.Request) -> web.StreamResponse:
    manager = request.app[MANAGER]
    task = pages(lambda page: manager.call("GetTask", page))
    return await stream(request, task, "steps", lambda first: {"task": first["task"]})


async def get_tools(request: web.Request) -> web.Response:
    tools = []
    for name in request.app[TASK]["tools"]:
        found = find_tool(name)
        if found is not None:
            tool = found[1]
            tools.append(
                {
                    "name": name,
                    "description": tool.description,
                    "input": tool.input.model_json_schema(),
                }
            )
    return web.json_response(tools)


async def post_step(request: web.Request) -> web.Response:
    step = parse(Step, await request.read())
    # The manager answers once the task's files are on disk and then the step: it flushes the
    # task's file system before the commit that holds the step (boxd.manager.task_flush), once
    # for all the steps committed together, and refuses the step with a 507 when it cannot.
    event = await request.app[MANAGER].call("LogStep", json.dumps(step.model_dump(mode="json")))
    return web.json_response(event)


async def post_call(request: web.Request) -> web.Response:
    return web.json_response(await request.app[CALLS].call(await request.read()))


async def post_ask(request: web.Request) -> web.Response:
    ask = parse(AskRequest, await request.read())
    approval = await request.app[MANAGER].call(
        "Ask", json.dumps(ask.model_dump(mode="json", exclude_none=True))
    )
    state = await request.app[WAITER].wait(approval, request.app[WAIT_SECONDS])
    if state == ApprovalState.PENDING:
        return web.json_response({"pending": True})
    return web.json_response({"approved": state == ApprovalState.APPROVED})


async def post_cost(request: web.Request) -> web.Response:
    cost = parse(CostRequest, await request.read())
    record = {"cents": cost.cents, "what": cost.what}
    return web.json_response(await request.app[MANAGER].call("LogCost", json.dumps(record)))


async def post_usage(request: web.Request) -> web.Response:
    usage = parse(UsageRequest, await request.read())
    record = {
        "cents": price_cents(usage.model, usage.tokens),
        "what": usage.what,
        "model": usage.model,
        "tokens": usage.tokens.model_dump(),
    }
    return web.json_response(await request.app[MANAGER].call("LogCost", json.dumps(record)))


async def _finish_calls(app: web.Application) -> None:
    await app[CALLS].finish()


def make_app(
    manager: Manager,
    waiter: Waiter,
    task: dict[str, Any],
    home: Path,
    task_dir: Path,
    wait_seconds: float,
) -> web.Application:
    # Errors are 400 as broker-api.txt says; 503 only while the manager is away, and 507 while
    # the box's disk is full: neither is the task's mistake, and both are worth asking again.
    errors = json_errors(
        lambda failure: failure.problem.http_status if failure.problem in _AGAIN else 400,
        "this broker serves GET /task, GET /tools and POST /step, /call, /ask, /cost, /usage",
    )
    app = web.Application(middlewares=[errors], client_max_size=MAX_BODY)
    app[MANAGER] = manager
    app[WAITER] = waiter
    app[TASK] = task
    app[TASK_DIR] = task_dir
    app[WAIT_SECONDS] = wait_seconds
    app[CALLS] = Calls(manager, waiter, task, home, wait_seconds)
    # Run when the broker is told to stop, before its connections are closed.
    app.on_shutdown.append(_finish_calls)
    app.router.add_get("/task", get_task)
    app.router.add_get("/tools", get_tools)
    app.router.add_post("/step", post_step)
    app.router.add_post("/call", post_call)
    app.router.add_post("/ask", post_ask)
    app.router.add_post("/cost", post_cost)
    app.router.add_post("/usage", post_usage)
    return app
