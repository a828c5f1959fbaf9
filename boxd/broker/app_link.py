"""The broker's way to the apps' runners (boxd/wire/app_runner.py). No app's code runs in a
broker, and a broker holds no app's secret: each app's tools run in the app's runner, as the
app's own user.

A broker opens one connection to each app whose tools its task uses, on first use, and sends
all its requests for that app over it. What a runner answers is checked as any caller's input is:
a runner runs an app's code, which the broker does not trust with its task's budget.
"""

import asyncio
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boxd.errors import Problem, die
from boxd.reading.caps import MAX_DATA, MAX_ERROR
from boxd.reading.strict_json import size
from boxd.wire.app_runner import MAX_LINE, SOCKETS, line, socket_path, too_large
from boxd.wire.secret_names import is_app_name


class AppAway(Exception):
    """The runner's connection ended with the request unanswered."""


class _NotInstalled(Exception):
    """No runner listens for the app."""


class _HelloLost(AppAway):
    """The connection ended before the runner said it was there: nothing was sent yet."""


class _NotStarted(Exception):
    """The runner's socket took the connection, and no runner answered in START_SECONDS."""


# How long a new connection waits for the runner to say it is there: systemd starts it on the
# connection, which then waits in the socket's queue. A runner that cannot start (its unit
# failing again and again) must not hold the broker's call for ever.
START_SECONDS = 30.0


@dataclass(frozen=True)
class Checked:
    """A call's input as its tool validated it, what it costs, and whether it always asks."""

    input: Any
    cost: float
    needs_ok: bool


def not_installed(tool: str) -> str:
    return f"no tool {tool}: it is not installed on this box"


def cut_off(app: str, tool: str) -> str:
    return (
        f"app {app} stopped while {tool} ran (its runner was restarted or killed): call it "
        "again with the same key; the tool gets the same key, so it does not do twice what it did"
    )


class _Connection:
    """One connection to a runner, and the requests waiting for their answers on it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.ended = False
        self.reading = asyncio.create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                text = await reader.readline()
                if not text:
                    break
                answer = json.loads(text)
                number = answer.get("id") if isinstance(answer, dict) else None
                waiting = self.waiting.get(number) if isinstance(number, int) else None
                if waiting is not None and not waiting.done():
                    waiting.set_result(answer)
        except (ValueError, ConnectionError):
            # A line longer than MAX_LINE, or not JSON: the runner is not to be read any more.
            pass
        finally:
            self.ended = True
            self.writer.close()
            for waiting in self.waiting.values():
                if not waiting.done():
                    waiting.set_exception(AppAway("the runner's connection ended"))


class AppLink:
    """The connection to one app's runner, opened again after it ends."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._opening = asyncio.Lock()
        self._connection: _Connection | None = None
        self._next = 0

    async def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """The runner's answer; AppAway if the connection ended first; FileNotFoundError or
        ConnectionRefusedError if no runner listens (the app is not installed)."""
        connection = await self._open()
        self._next += 1
        number = self._next
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        connection.waiting[number] = answer
        try:
            connection.writer.write(line({"id": number, **request}))
            await connection.writer.drain()
            return await answer
        except ConnectionError as error:
            raise AppAway(str(error)) from None
        finally:
            connection.waiting.pop(number, None)

    async def _open(self) -> _Connection:
        async with self._opening:
            if self._connection is None or self._connection.ended:
                reader, writer = await asyncio.open_unix_connection(str(self._path), limit=MAX_LINE)
                connection = _Connection(reader, writer)
                # The runner answers before anything goes its way: what is sent after goes to a
                # runner that started.
                hello: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
                connection.waiting[0] = hello
                writer.write(line({"id": 0, "do": "hello"}))
                try:
                    await asyncio.wait_for(hello, START_SECONDS)
                except TimeoutError:
                    writer.close()
                    connection.reading.cancel()
                    raise _NotStarted from None
                except AppAway:
                    raise _HelloLost from None
                finally:
                    connection.waiting.pop(0, None)
                self._connection = connection
            return self._connection

    async def close(self) -> None:
        if self._connection is not None:
            self._connection.writer.close()
            self._connection.reading.cancel()
            await asyncio.gather(self._connection.reading, return_exceptions=True)


class Apps:
    """The runners of the apps a broker's task uses, each reached at `<directory>/<app>.sock`."""

    def __init__(self, directory: Path = SOCKETS) -> None:
        self._directory = directory
        self._links: dict[str, AppLink] = {}
        self._tools: dict[str, dict[str, dict[str, Any]]] = {}

    async def _ask(self, tool: str, request: dict[str, Any], again: bool) -> dict[str, Any]:
        """The answer of the runner of `tool`'s app; asked twice when `again` (what changes
        nothing) if the first connection ended without the answer."""
        app = tool.partition(".")[0]
        if not is_app_name(app):
            raise _NotInstalled
        link = self._links.get(app)
        if link is None:
            link = self._links[app] = AppLink(socket_path(self._directory, app))
        for attempt in (1, 2):
            try:
                return await link.ask(request)
            except (FileNotFoundError, ConnectionRefusedError):
                raise _NotInstalled from None
            except _NotStarted:
                die(
                    Problem.UNAVAILABLE,
                    f"app {app}'s runner did not start in {START_SECONDS:g} s; the box's owner "
                    f"finds why in `journalctl -u box-app@{app}`",
                )
            except AppAway as away:
                # Asked again only what changes nothing, or what was never sent.
                if attempt == 2 or not (again or isinstance(away, _HelloLost)):
                    raise
            except OSError as error:
                die(Problem.UNAVAILABLE, f"cannot reach app {app}'s runner: {error.strerror}")
        raise AssertionError("unreachable")

    async def tools(self, names: list[str]) -> list[dict[str, Any]]:
        """`GET /tools`: of `names`, those installed, with their descriptions and input
        schemas, in that order."""
        shown = []
        for name in names:
            offered = await self._offered(name)
            found = offered.get(name)
            if found is not None:
                shown.append(
                    {"name": name, "description": found["description"], "input": found["input"]}
                )
        return shown

    async def _offered(self, name: str) -> dict[str, dict[str, Any]]:
        app = name.partition(".")[0]
        if app not in self._tools:
            try:
                answer = await self._ask(name, {"do": "tools"}, again=True)
            except _NotInstalled:
                return {}
            except AppAway:
                die(Problem.UNAVAILABLE, f"app {app}'s runner went away; ask again")
            listed = answer.get("tools")
            if not isinstance(listed, list):
                die(Problem.INVALID, f"app {app} answered what is not a list of its tools")
            self._tools[app] = {
                tool["name"]: tool
                for tool in listed
                if isinstance(tool, dict)
                and isinstance(tool.get("name"), str)
                and tool["name"].startswith(f"{app}.")
                and isinstance(tool.get("description"), str)
                and isinstance(tool.get("input"), dict)
            }
        return self._tools[app]

    async def check(self, tool: str, given: Any) -> Checked:
        try:
            answer = await self._ask(tool, {"do": "check", "tool": tool, "input": given}, True)
        except _NotInstalled:
            die(Problem.INVALID, not_installed(tool))
        except AppAway:
            die(Problem.UNAVAILABLE, f"the runner of {tool} went away; call it again")
        _refused(answer)
        cost, needs_ok = answer.get("costCents"), answer.get("needsOk")
        if (
            not isinstance(cost, int | float)
            or isinstance(cost, bool)
            or not math.isfinite(cost)
            or cost < 0
        ):
            die(Problem.INVALID, f"{tool} gave a cost that is not a number of cents, 0 or more")
        if not isinstance(needs_ok, bool) or "input" not in answer:
            die(Problem.INVALID, f"{tool}'s runner answered what is not a checked input")
        return Checked(answer["input"], float(cost), needs_ok)

    async def run(self, tool: str, given: Any, key: str, task: dict[str, Any]) -> dict[str, Any]:
        """The tool's answer, `{ok, output}` or `{ok: false, error}`, to record. A 503 when the
        runner went away mid-run (the call runs again with the same key), a 507 when the disk
        was full (nothing to record)."""
        request = {"do": "run", "tool": tool, "input": given, "key": key, "task": task}
        try:
            answer = await self._ask(tool, request, again=False)
        except _NotInstalled:
            die(Problem.INVALID, not_installed(tool))
        except AppAway:
            die(Problem.UNAVAILABLE, cut_off(tool.partition(".")[0], tool))
        _refused(answer)
        if isinstance(answer.get("full"), str):
            die(Problem.FULL, answer["full"][:MAX_ERROR])
        if answer.get("ok") is True:
            output = answer.get("output")
            # The runner says so itself; an app's code, in the same process, could keep it from.
            if size(output) > MAX_DATA:
                return {"ok": False, "error": too_large(tool)}
            return {"ok": True, "output": output}
        error = answer.get("error")
        if answer.get("ok") is not False or not isinstance(error, str):
            die(Problem.INVALID, f"{tool}'s runner answered what is not a tool's answer")
        return {"ok": False, "error": error[:MAX_ERROR] or f"{tool} failed"}

    async def close(self) -> None:
        await asyncio.gather(*(link.close() for link in self._links.values()))


def _refused(answer: dict[str, Any]) -> None:
    refused = answer.get("refused")
    if refused is not None:
        die(Problem.INVALID, str(refused)[:MAX_ERROR])
