"""`boxd app <name>`: one app's runner, serving the brokers on the socket box-app@<name>.socket
passes (boxd/wire/app_runner.py), as the app's own user (box-app@.service).

It answers every run on a connection at once, each in a job of its own, so one slow tool holds
up no other; what waits for nothing (a check of a call's input, the tools) it answers as it
reads it. Told to stop (the box shutting down, or the manager restarting it because a
secret of the app changed), it reads no more requests, lets the runs it started finish and
answer, for up to FINISH_SECONDS, and exits: a request it did not read is left unanswered, and
the broker asks the next runner, which the socket starts. With no connection open and nothing
running for BOX_APP_IDLE_MS (default 60 s) it exits 0 too; the socket starts it again on the
next connection.
"""

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from boxd.apps.runner import Runner
from boxd.doors import idle_time
from boxd.wire.app_runner import MAX_LINE, line

log = logging.getLogger(__name__)

IDLE_VARIABLE = "BOX_APP_IDLE_MS"
# As a broker lets its tools finish (boxd/broker/calls.py FINISH_SECONDS), well under the
# unit's TimeoutStopSec.
FINISH_SECONDS = 30.0

Answer = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class AppServer:
    def __init__(self, answer: Answer, idle_seconds: float | None) -> None:
        self._answer = answer
        self._idle_seconds = idle_seconds
        self._readers: set[asyncio.Task[None]] = set()
        self._running: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._idle: asyncio.TimerHandle | None = None
        self.idle = asyncio.Event()
        self._servers: list[asyncio.Server] = []

    async def start(self, listening: list[Any]) -> None:
        self._servers = [
            await asyncio.start_unix_server(self._connected, sock=sock, limit=MAX_LINE)
            for sock in listening
        ]
        self._quiet()

    def _quiet(self) -> None:
        """Counts the idle time from now if nothing is in hand."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._idle_seconds is not None and not self._readers and not self._running:
            self._idle = asyncio.get_running_loop().call_later(self._idle_seconds, self.idle.set)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None  # asyncio runs each connection's callback as a task
        self._readers.add(me)
        self._writers.add(writer)
        self._quiet()
        jobs: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    text = await reader.readline()
                except (ValueError, ConnectionError):
                    # Longer than MAX_LINE, or the broker went: the connection ends.
                    break
                if not text:
                    break
                try:
                    request = json.loads(text)
                    number = request["id"]
                except (ValueError, TypeError, KeyError):
                    log.warning("a request that is not one of the wire's came; connection closed")
                    break
                if isinstance(request, dict) and request.get("do") != "run":
                    # What waits for nothing (a hello, the tools, a check) is answered here: a
                    # job of its own was a good part of what a call cost its runner.
                    await self._serve(writer, number, request)
                    continue
                run = asyncio.create_task(self._serve(writer, number, request))
                for holder in (jobs, self._running):
                    holder.add(run)
                run.add_done_callback(jobs.discard)
                run.add_done_callback(self._ran)
            if jobs:
                await asyncio.wait(set(jobs))
            self._close(writer)
        except asyncio.CancelledError:
            # Stopping: stop() lets the runs finish and closes the connections.
            pass
        finally:
            self._readers.discard(me)
            self._quiet()

    def _ran(self, run: "asyncio.Task[None]") -> None:
        self._running.discard(run)
        self._quiet()

    async def _serve(self, writer: asyncio.StreamWriter, number: Any, request: Any) -> None:
        try:
            answer = await self._answer(request) if isinstance(request, dict) else {}
        except Exception:
            log.exception("the runner could not answer a request")
            answer = {"refused": "the app's runner failed to answer; see its journal"}
        if writer.is_closing():
            return
        try:
            writer.write(line({"id": number, **answer}))
        except (TypeError, ValueError):
            log.exception("an answer could not be written as JSON")
            writer.write(line({"id": number, "refused": "the app answered with what is not JSON"}))
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    def _close(self, writer: asyncio.StreamWriter) -> None:
        self._writers.discard(writer)
        writer.close()

    async def stop(self, seconds: float = FINISH_SECONDS) -> None:
        """Reads no more requests; lets the runs begun finish and answer; closes."""
        for server in self._servers:
            server.close()
        for reader in list(self._readers):
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        if self._running:
            log.info("letting %d tool run(s) finish before the runner stops", len(self._running))
            await asyncio.wait(set(self._running), timeout=seconds)
        for writer in list(self._writers):
            self._close(writer)
        if self._idle is not None:
            self._idle.cancel()


def idle_seconds(environ: Mapping[str, str] | None = None) -> float | None:
    """The idle time the runner's environment sets, in seconds; None when 0: never exit."""
    return idle_time.idle_seconds(IDLE_VARIABLE, "the runner", environ)


def make_runner(name: str) -> Runner:
    """The app's runner, its code loaded; one that could not be loaded refuses every tool."""
    from boxd.apps.registry import load
    from boxd.wire.credentials import read_secrets

    state = Path(os.environ.get("STATE_DIRECTORY", f"/var/lib/box/apps/{name}"))
    try:
        app = load(name)
    except Exception as error:
        log.exception("app %s could not be loaded", name)
        return Runner(name, None, f"{type(error).__name__}: {error}", state, read_secrets)
    return Runner(name, app, "", state, read_secrets)


async def run(name: str) -> None:
    from boxd.doors.socket_activation import passed_sockets
    from boxd.doors.stopping import until_stopped
    from boxd.wire.secret_names import is_app_name

    if not is_app_name(name):
        raise SystemExit(f"boxd app: {name!r} is not an app's name")
    passed = passed_sockets(f"box-app@{name}.socket")
    runner = make_runner(name)
    server = AppServer(runner.answer, idle_seconds())
    await server.start([door for doors in passed.values() for door in doors])
    stopped = asyncio.ensure_future(until_stopped())
    idle = asyncio.ensure_future(server.idle.wait())
    try:
        await asyncio.wait({stopped, idle}, return_when=asyncio.FIRST_COMPLETED)
        if idle.done() and not stopped.done():
            log.info("nothing in hand: app %s's runner exits; its socket starts it again", name)
    finally:
        stopped.cancel()
        idle.cancel()
        await server.stop()


def main(name: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(run(name))
