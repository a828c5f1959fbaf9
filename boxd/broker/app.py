"""The broker API of docs/spec/broker-api.txt, over HTTP on the task's socket."""

import json
from dataclasses import dataclass
from typing import Any

from boxd.broker.app_link import Apps
from boxd.broker.calls import Calls
from boxd.broker.http_request import Request
from boxd.broker.http_server import Answer, Routes, json_answer
from boxd.broker.manager_link import Manager, Waiter
from boxd.dbus import interface as api
from boxd.dbus.client import pages
from boxd.doors.json_pages import pieces
from boxd.errors import BoxError, Problem
from boxd.reading.caps import MAX_LABEL, cents_of, text
from boxd.reading.json_reader import body
from boxd.wire.approval import ApprovalState, AskRequest
from boxd.wire.pricing import Tokens, price_cents
from boxd.wire.step import Step

_what = text("what", MAX_LABEL)


@dataclass(frozen=True)
class CostRequest:
    """The body of `POST /cost`."""

    cents: float
    what: str

    @classmethod
    def read(cls, raw: bytes) -> "CostRequest":
        fields = body(raw)
        cost = cls(fields.required("cents", cents_of("cents")), fields.required("what", _what))
        fields.done()
        return cost


@dataclass(frozen=True)
class UsageRequest:
    """The body of `POST /usage`: the cost is the model's list price of the tokens."""

    model: str
    tokens: Tokens
    what: str = "model"

    @classmethod
    def read(cls, raw: bytes) -> "UsageRequest":
        fields = body(raw)
        usage = cls(
            fields.required("model", text("model", MAX_LABEL)),
            fields.required("tokens", lambda value: Tokens.read(value, ("tokens",))),
            fields.optional("what", _what, "model"),
        )
        fields.done()
        return usage


# Refusals that say "nothing was done; ask again later" rather than "this request is wrong".
_AGAIN = (Problem.UNAVAILABLE, Problem.FULL)


@dataclass
class Broker:
    """One task's broker API: what it answers with, and what it holds."""

    manager: Manager
    waiter: Waiter
    task: dict[str, Any]
    wait_seconds: float
    apps: Apps
    calls: Calls

    async def get_task(self, request: Request) -> Answer:
        task = pages(lambda page: self.manager.call(api.BROKER_GET_TASK, page))
        first = await anext(task)
        return Answer(200, pieces=pieces(first, task, "steps", lambda page: {"task": page["task"]}))

    async def get_tools(self, request: Request) -> Answer:
        return json_answer(await self.apps.tools(list(self.task["tools"])))

    async def post_step(self, request: Request) -> Answer:
        step = Step.read(request.body)
        # The manager answers once the task's files are on disk and then the step: it flushes
        # the task's file system before the commit that holds the step
        # (boxd.manager.record.task_flush), once for all the steps committed together, and refuses
        # the step with a 507 when it cannot.
        event = await self.manager.call(api.LOG_STEP, json.dumps(step.json()))
        return json_answer(event)

    async def post_call(self, request: Request) -> Answer:
        return json_answer(await self.calls.call(request.body))

    async def post_ask(self, request: Request) -> Answer:
        ask = AskRequest.read(request.body)
        approval = await self.manager.call(api.ASK, json.dumps(ask.json()))
        state = await self.waiter.wait(approval, self.wait_seconds)
        if state == ApprovalState.PENDING:
            return json_answer({"pending": True})
        return json_answer({"approved": state == ApprovalState.APPROVED})

    async def post_cost(self, request: Request) -> Answer:
        cost = CostRequest.read(request.body)
        record = {"cents": cost.cents, "what": cost.what}
        return json_answer(await self.manager.call(api.LOG_COST, json.dumps(record)))

    async def post_usage(self, request: Request) -> Answer:
        usage = UsageRequest.read(request.body)
        record = {
            "cents": price_cents(usage.model, usage.tokens),
            "what": usage.what,
            "model": usage.model,
            "tokens": usage.tokens.json(),
        }
        return json_answer(await self.manager.call(api.LOG_COST, json.dumps(record)))

    def routes(self) -> Routes:
        return Routes(
            {
                "/task": {"GET": self.get_task},
                "/tools": {"GET": self.get_tools},
                "/step": {"POST": self.post_step},
                "/call": {"POST": self.post_call},
                "/ask": {"POST": self.post_ask},
                "/cost": {"POST": self.post_cost},
                "/usage": {"POST": self.post_usage},
            },
            _status_of,
            "this broker serves GET /task, GET /tools and POST /step, /call, /ask, /cost, /usage",
            # Run when the broker is told to stop, before its connections are closed.
            on_close=[self.calls.finish],
        )


def _status_of(failure: BoxError) -> int:
    # Errors are 400 as docs/spec/broker-api.txt says; 503 only while the manager is away, and
    # 507 while the box's disk is full: neither is the task's mistake, and both are worth asking
    # again.
    return failure.problem.http_status if failure.problem in _AGAIN else 400


def make_broker(
    manager: Manager,
    waiter: Waiter,
    task: dict[str, Any],
    apps: Apps,
    wait_seconds: float,
) -> Broker:
    calls = Calls(manager, waiter, task, apps, wait_seconds)
    return Broker(manager, waiter, task, wait_seconds, apps, calls)
