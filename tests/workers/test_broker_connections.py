"""The workers' kept-alive connections to their broker (unix_http.Connections): requests one
after another share a connection, requests at the same time get one each, a streamed (chunked)
answer is read whole, and a connection the broker closed while it sat idle is not used again."""

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from boxd.workers.unix_http import Connections


class Broker:
    def __init__(self) -> None:
        self.transports: list[int] = []
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    async def step(self, request: web.Request) -> web.Response:
        self.transports.append(id(request.transport))
        return web.json_response({"got": await request.json()})

    async def slow(self, request: web.Request) -> web.Response:
        self.transports.append(id(request.transport))
        self.asked.set()
        await self.release.wait()
        return web.json_response({"pending": False})

    async def task(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        await response.write(b'{"steps": [')
        await response.write(b'{"text": "one"}, {"text": "two"}')
        await response.write(b"]}")
        await response.write_eof()
        return response


async def serve(broker: Broker, path: str) -> web.AppRunner:
    app = web.Application()
    app.router.add_post("/step", broker.step)
    app.router.add_post("/ask", broker.slow)
    app.router.add_get("/task", broker.task)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, path).start()
    return runner


async def test_requests_one_after_another_share_a_connection(tmp_path: Path) -> None:
    broker = Broker()
    path = str(tmp_path / "broker.sock")
    runner = await serve(broker, path)
    connections = Connections(path)
    try:
        for number in range(3):
            answer: Any = await connections.exchange("POST", "/step", b'{"line": %d}' % number)
            assert answer == (200, {"got": {"line": number}})
        status, task = await connections.exchange("GET", "/task", None)
        assert status == 200 and task == {"steps": [{"text": "one"}, {"text": "two"}]}
        await connections.exchange("POST", "/step", b"{}")
    finally:
        connections.close()
        await runner.cleanup()
    assert len(broker.transports) == 4 and len(set(broker.transports)) == 1


async def test_requests_at_the_same_time_get_a_connection_each(tmp_path: Path) -> None:
    broker = Broker()
    path = str(tmp_path / "broker.sock")
    runner = await serve(broker, path)
    connections = Connections(path)
    try:
        ask = asyncio.create_task(connections.exchange("POST", "/ask", b"{}"))
        await asyncio.wait_for(broker.asked.wait(), 5)
        # The ask waits for its answer: the step does not wait behind it.
        step = await asyncio.wait_for(connections.exchange("POST", "/step", b"{}"), 5)
        assert step[0] == 200 and not ask.done()
        broker.release.set()
        assert await ask == (200, {"pending": False})
    finally:
        connections.close()
        await runner.cleanup()
    assert len(set(broker.transports)) == 2


async def test_a_connection_the_broker_closed_while_idle_is_not_used(tmp_path: Path) -> None:
    """A broker that stopped (and is started again by its socket) closed the worker's idle
    connection: the next request goes on a new one, and does not fail."""
    path = str(tmp_path / "broker.sock")
    runner = await serve(Broker(), path)
    connections = Connections(path)
    try:
        assert (await connections.exchange("POST", "/step", b"{}"))[0] == 200
        await runner.cleanup()
        again = Broker()
        runner = await serve(again, path)
        # The worker's event loop has seen the idle connection closed (read to its end here).
        (idle, _writer), _timer = connections._idle[0]
        assert await asyncio.wait_for(idle.read(), 5) == b""
        assert (await connections.exchange("POST", "/step", b"{}"))[0] == 200
        assert len(again.transports) == 1
    finally:
        connections.close()
        await runner.cleanup()


async def test_a_connection_left_unused_is_closed(tmp_path: Path) -> None:
    """As aiohttp's client did: a broker is not held by a worker that has gone quiet."""
    broker = Broker()
    path = str(tmp_path / "broker.sock")
    runner = await serve(broker, path)
    connections = Connections(path, idle_seconds=0.05)
    try:
        await connections.exchange("POST", "/step", b"{}")
        assert connections.idle() == 1
        (reader, _writer), _timer = connections._idle[0]
        # Closed by the worker itself once its idle time is up (its own end reads empty).
        await asyncio.wait_for(reader.read(), 5)
        assert connections.idle() == 0
        assert (await connections.exchange("POST", "/step", b"{}"))[0] == 200
        assert len(set(broker.transports)) == 2
    finally:
        connections.close()
        await runner.cleanup()
