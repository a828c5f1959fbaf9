"""The worker's broker client against a broker that drops connections or whose manager is away:
requests are sent again, a step whose answer was lost is logged once, and a broker that stays
away is an error in words after the client's patience."""

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from boxd.workers.broker_client import BrokerClient, BrokerGone


class FlakyBroker:
    """Keeps the steps it logged; `drops` says, step by step, how to fail the next /step:
    "before" (drop it unlogged), "after" (log it, then drop the answer), "away" (503),
    "full" (507: the disk is full, nothing logged)."""

    def __init__(self, *drops: str) -> None:
        self.steps: list[dict[str, Any]] = []
        self.drops = list(drops)
        self.tries = 0

    async def task(self, request: web.Request) -> web.Response:
        return web.json_response({"task": {"id": "t1"}, "steps": self.steps})

    async def step(self, request: web.Request) -> web.StreamResponse:
        self.tries += 1
        body = await request.json()
        drop = self.drops.pop(0) if self.drops else None
        if drop == "away":
            return web.json_response({"error": "the box's manager is away"}, status=503)
        if drop == "full":
            return web.json_response({"error": "The box's disk is full."}, status=507)
        if drop != "before":
            self.steps.append({"text": body["text"], "data": body.get("data")})
        if drop is not None:
            assert request.transport is not None
            request.transport.abort()
            return web.StreamResponse()
        return web.json_response({"kind": "task.step", "data": body})


async def serve(broker: FlakyBroker, path: str) -> web.AppRunner:
    app = web.Application()
    app.router.add_get("/task", broker.task)
    app.router.add_post("/step", broker.step)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, path).start()
    return runner


@pytest.mark.parametrize("drops", [("before",), ("after",), ("away",), ("before", "away", "after")])
async def test_a_step_whose_answer_was_lost_is_logged_once(
    tmp_path: Path, drops: tuple[str, ...]
) -> None:
    broker = FlakyBroker(*drops)
    broker.steps.append({"text": "one", "data": {"line": 1}})
    path = str(tmp_path / "broker.sock")
    runner = await serve(broker, path)
    try:
        async with BrokerClient(path, patience_seconds=10) as client:
            await client.task()
            await client.step("two", {"line": 2})
            await client.step("three", {"line": 3})
    finally:
        await runner.cleanup()
    assert broker.steps == [
        {"text": "one", "data": {"line": 1}},
        {"text": "two", "data": {"line": 2}},
        {"text": "three", "data": {"line": 3}},
    ]


async def test_a_step_equal_to_an_earlier_one_is_still_logged(tmp_path: Path) -> None:
    """Only the steps after those the worker knew of count as its lost one."""
    broker = FlakyBroker("before")
    broker.steps.append({"text": "same", "data": None})
    path = str(tmp_path / "broker.sock")
    runner = await serve(broker, path)
    try:
        async with BrokerClient(path, patience_seconds=10) as client:
            await client.task()
            await client.step("same")
    finally:
        await runner.cleanup()
    assert broker.steps == [{"text": "same", "data": None}] * 2


async def test_a_broker_that_stays_away_is_an_error_in_words(tmp_path: Path) -> None:
    path = str(tmp_path / "nothing.sock")
    async with BrokerClient(path, patience_seconds=0.5) as client:
        with pytest.raises(BrokerGone) as gone:
            await client.step("lost")
    words = str(gone.value)
    assert words.startswith(f"POST /step: the task's broker at {path} gave no answer for 0.5 s")


async def test_a_full_disk_is_waited_out_past_the_patience_and_the_step_logged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 507 is not the broker gone: the worker waits for room as long as it takes (here
    longer than its patience) and says so once, then the step is logged, once."""
    monkeypatch.setattr("boxd.workers.broker_client.FULL_PAUSE_SECONDS", 0.05)
    broker = FlakyBroker(*["full"] * 8, "after")
    path = str(tmp_path / "broker.sock")
    runner = await serve(broker, path)
    try:
        async with BrokerClient(path, patience_seconds=0.2) as client:
            await client.task()
            await client.step("one", {"line": 1})
    finally:
        await runner.cleanup()
    assert broker.steps == [{"text": "one", "data": {"line": 1}}]
    # Eight refusals, then one logged whose answer was lost: found in GET /task, not resent.
    assert broker.tries == 9
    said = capsys.readouterr().err
    assert said == "POST /step: The box's disk is full. Waiting for room.\n"
