"""A task's broker as an agent's worker sees it, scripted, on a Unix socket: for the tests that
run a worker with its real agent (tests/workers/droid/test_real.py, tests/workers/claude/)."""

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from boxd.workers.agent_program import AgentRun


class ScriptedBroker:
    """GET /task and /tools, POST /step and /ask (answered from a script). `earlier` are the
    steps a worker started again finds in the log; `steps` those it logs, `asked` its asks."""

    def __init__(self, task: dict[str, Any], *asks: dict[str, Any]) -> None:
        self.task = task
        self.steps: list[dict[str, Any]] = []
        self.earlier: list[dict[str, Any]] = []
        self.asked: list[dict[str, Any]] = []
        self._asks = list(asks)

    async def _task(self, request: web.Request) -> web.Response:
        return web.json_response({"task": self.task, "steps": self.earlier})

    async def _tools(self, request: web.Request) -> web.Response:
        return web.json_response([])

    async def _step(self, request: web.Request) -> web.Response:
        self.steps.append(await request.json())
        return web.json_response({})

    async def _ask(self, request: web.Request) -> web.Response:
        self.asked.append(await request.json())
        return web.json_response(self._asks.pop(0))

    def started_again(self, *asks: dict[str, Any]) -> "ScriptedBroker":
        """The broker as a worker started again finds it: the same task, with the steps logged
        so far."""
        again = ScriptedBroker(self.task, *asks)
        again.earlier = self.steps
        return again

    def kinds(self) -> list[str]:
        return [step["data"]["kind"] for step in self.steps]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/task", self._task)
        app.router.add_get("/tools", self._tools)
        app.router.add_post("/step", self._step)
        app.router.add_post("/ask", self._ask)
        return app


def agent_task(
    title: str, model: str, prompt: str, autonomy: str = "low", plan: bool = False
) -> dict[str, Any]:
    return {
        "id": "t1",
        "title": title,
        "model": model,
        "prompt": prompt,
        "droid": {"autonomy": autonomy, "plan": plan},
    }


async def run_worker(
    run: AgentRun,
    broker: ScriptedBroker,
    gateway_url: str,
    socket_dir: Path,
    home: Path,
    work_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's `run` against `broker` on a socket in `socket_dir` (the same for a worker
    started again, as a task's broker socket is), as boxd starts it: HOME its own."""
    monkeypatch.setenv("HOME", str(home))
    runner = web.AppRunner(broker.app())
    await runner.setup()
    socket = socket_dir / "broker.sock"
    try:
        await web.UnixSite(runner, str(socket)).start()
        await run(str(socket), home, work_dir, gateway_url)
    finally:
        await runner.cleanup()
