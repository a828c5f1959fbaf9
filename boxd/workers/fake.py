"""The fake worker: the prompt is a script, one command per line, no model.

After each finished line it logs a step with `data: {"line": N}`; started again, it skips the
lines already logged, as a real worker resumes from its steps. When the script is done it prints
one line, ROUND_TRIPS and JSON, with how long each step and call took its broker to answer, as
seen from here (bench/load.py reads them from the worker's journal). Timed in memory and
printed once at the end, so the timing costs the steps nothing.

`acks PATH` makes it append every step the broker acknowledged (or that it found logged after
an answer was lost) to PATH, one JSON line each, fsynced before it goes on: the witness that
testbed/chaos.py holds the log to after kills and power cuts. It holds for the rest of the
script, also on a resume that skips the `acks` line itself.
"""

# First, when this module is the program: asyncio without ssl, as a task's processes have it
# (boxd/patches/asyncio.py). Imported as a library (by the worker started ahead, by tests), it
# leaves that to the program.
from boxd.patches.asyncio import import_asyncio_without_ssl

if __name__ == "__main__":
    import_asyncio_without_ssl()

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from boxd.workers.broker_client import BrokerClient, BrokerGarbled, BrokerGone, BrokerRefused

MAX_OUTPUT = 4000
# The start of the line the worker prints at its end; the JSON after it is
# {"step": [seconds, ...], "call": [seconds, ...]}, one entry per answered request, in order.
ROUND_TRIPS = "fake worker round trips: "
# How much of a fetched body its step shows.
FETCH_SHOWN = 200
FETCH_SECONDS = 60


class ScriptFailed(Exception):
    pass


class RoundTrips:
    """Seconds from sending each step and call to the broker's answer (its retries included);
    a request that got no answer is not counted."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {"step": [], "call": []}

    @contextmanager
    def timing(self, kind: str) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self.seconds[kind].append(round(time.perf_counter() - started, 6))

    def line(self) -> str:
        return ROUND_TRIPS + json.dumps(self.seconds, separators=(",", ":"))


async def _step(argument: str) -> str:
    return argument


async def _write(argument: str) -> str:
    path, _, text = argument.partition(" ")
    if not path:
        raise ScriptFailed("write needs a path and a text: write PATH TEXT")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    await asyncio.to_thread(target.write_text, text)
    return f"wrote {path}"


async def _delete(argument: str) -> str:
    if not argument:
        raise ScriptFailed("delete needs a path: delete PATH")
    try:
        await asyncio.to_thread(Path(argument).unlink)
    except FileNotFoundError:
        raise ScriptFailed(f"delete: there is no {argument}") from None
    return f"deleted {argument}"


async def _sh(argument: str) -> str:
    if not argument:
        raise ScriptFailed("sh needs a command: sh COMMAND")
    process = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        argument,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    text = output.decode(errors="replace").strip()[:MAX_OUTPUT]
    if process.returncode != 0:
        raise ScriptFailed(f"sh {argument!r} exited with status {process.returncode}: {text}")
    return text or f"ran {argument}"


async def _fetch(argument: str) -> str:
    """GET through the proxy the environment names, as any program would: the task's network
    reaches nothing else."""
    if not argument:
        raise ScriptFailed("fetch needs a URL: fetch URL")
    # Imported here, not with the module: it takes longer than the rest of the worker's
    # start-up, and only scripts that fetch need it.
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=FETCH_SECONDS)
    try:
        async with (
            aiohttp.ClientSession(trust_env=True, timeout=timeout) as session,
            session.get(argument, allow_redirects=False) as response,
        ):
            body = await response.content.read(FETCH_SHOWN)
            shown = body.decode(errors="replace").strip()
            status = f"{response.status} {response.reason or ''}".strip()
    except aiohttp.ClientHttpProxyError as refused:
        # A refused CONNECT: aiohttp reads no body there, and boxd's words are in its reason.
        raise ScriptFailed(
            f"fetch {argument}: the proxy answered {refused.status} {refused.message}"
        ) from None
    except (aiohttp.ClientError, TimeoutError, ValueError) as error:
        raise ScriptFailed(f"fetch {argument}: {error or type(error).__name__}") from None
    if response.status >= 400:
        raise ScriptFailed(f"fetch {argument}: {status}: {shown}")
    return f"{status}: {shown}"


async def _sleep(argument: str) -> str:
    try:
        seconds = float(argument)
    except ValueError:
        raise ScriptFailed(f"sleep needs a number of seconds, not {argument!r}") from None
    await asyncio.sleep(seconds)
    return f"slept {argument} s"


async def _fail(argument: str) -> str:
    raise ScriptFailed(argument or "the script said fail")


# Commands that talk to the broker get it and their line's key, `line-N`.
Broker = tuple[BrokerClient, str]


async def _until_answered(broker: BrokerClient, path: str, body: dict[str, Any]) -> Any:
    """A pending answer means the owner has not decided yet: ask again, as long as it takes.
    (A broker that went away mid-call is asked again by the client, with the same key, which is
    what makes the call happen once.)"""
    while True:
        answer = await broker.post(path, body)
        if not (isinstance(answer, dict) and answer.get("pending")):
            return answer


async def _call(argument: str, broker: Broker) -> str:
    tool, _, text = argument.partition(" ")
    try:
        given = json.loads(text or "{}")
    except json.JSONDecodeError as error:
        raise ScriptFailed(f"call {tool}: the input is not JSON: {error}") from None
    answer = await _until_answered(
        broker[0], "/call", {"tool": tool, "input": given, "key": broker[1]}
    )
    if answer.get("ok"):
        return f"{tool}: {json.dumps(answer.get('output'))}"
    return f"{tool} failed: {answer.get('error')}"


async def _ask(argument: str, broker: Broker) -> str:
    answer = await _until_answered(broker[0], "/ask", {"question": argument, "key": broker[1]})
    return "approved" if answer.get("approved") else "not approved"


async def _cost(argument: str, broker: Broker) -> str:
    amount, _, what = argument.partition(" ")
    try:
        cents = float(amount)
    except ValueError:
        raise ScriptFailed(f"cost needs a number of cents, not {amount!r}") from None
    await broker[0].post("/cost", {"cents": cents, "what": what or "unspecified"})
    return f"spent {amount} cents on {what or 'unspecified'}"


async def _usage(argument: str, broker: Broker) -> str:
    words = argument.split()
    if not 3 <= len(words) <= 5 or not all(w.isdigit() for w in words[1:]):
        raise ScriptFailed("usage needs MODEL INPUT OUTPUT [CACHEWRITE CACHEREAD] token counts")
    counts = [int(w) for w in words[1:]] + [0] * (5 - len(words))
    tokens = dict(zip(("input", "output", "cacheWrite", "cacheRead"), counts, strict=True))
    event = await broker[0].post("/usage", {"model": words[0], "tokens": tokens})
    return f"{words[0]} usage costs {event['data']['cents']:g} cents"


COMMANDS: dict[str, Callable[[str], Awaitable[str]]] = {
    "step": _step,
    "write": _write,
    "delete": _delete,
    "sh": _sh,
    "fetch": _fetch,
    "sleep": _sleep,
    "fail": _fail,
}
BROKER_COMMANDS: dict[str, Callable[[str, Broker], Awaitable[str]]] = {
    "call": _call,
    "ask": _ask,
    "cost": _cost,
    "usage": _usage,
}


def _acknowledge(path: Path, number: int, text: str) -> None:
    """One acknowledged step, on disk before the worker goes on."""
    with path.open("a") as file:
        file.write(json.dumps({"line": number, "text": text}) + "\n")
        file.flush()
        os.fsync(file.fileno())


def last_line_done(steps: list[dict[str, Any]]) -> int:
    lines = [
        step["data"]["line"]
        for step in steps
        if isinstance(step.get("data"), dict) and isinstance(step["data"].get("line"), int)
    ]
    return max(lines, default=0)


def _acks_path(number: int, argument: str) -> Path:
    if not argument:
        raise ScriptFailed(f"line {number}: acks needs a path: acks PATH")
    path = Path(argument)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


async def _run_line(number: int, command: str, argument: str, broker: BrokerClient) -> str:
    if command not in COMMANDS and command not in BROKER_COMMANDS:
        raise ScriptFailed(f"line {number}: unknown command {command!r}")
    try:
        if command in BROKER_COMMANDS:
            return await BROKER_COMMANDS[command](argument, (broker, f"line-{number}"))
        return await COMMANDS[command](argument)
    except (ScriptFailed, BrokerRefused) as failure:
        raise ScriptFailed(f"line {number}: {failure}") from None


async def run(socket_path: str, trips: RoundTrips | None = None) -> RoundTrips:
    trips = RoundTrips() if trips is None else trips
    async with BrokerClient(socket_path) as broker:
        state = await broker.task()
        done = last_line_done(state["steps"])
        acks: Path | None = None
        for number, line in enumerate(state["task"]["prompt"].splitlines(), start=1):
            command, _, argument = line.strip().partition(" ")
            if command == "acks":
                # Read also when skipped: a resumed worker acknowledges where it left off.
                acks = _acks_path(number, argument.strip())
            if number <= done or not command or command.startswith("#"):
                continue
            if command == "acks":
                text = f"acknowledging steps in {acks}"
            elif command == "call":
                with trips.timing("call"):
                    text = await _run_line(number, command, argument.strip(), broker)
            else:
                text = await _run_line(number, command, argument.strip(), broker)
            with trips.timing("step"):
                await broker.step(text, {"line": number})
            if acks is not None:
                await asyncio.to_thread(_acknowledge, acks, number, text)
    return trips


def main() -> None:
    socket_path = os.environ.get("BOX_SOCKET")
    if not socket_path:
        sys.exit("fake worker: BOX_SOCKET is not set; boxd starts this worker for a task")
    try:
        trips = asyncio.run(run(socket_path))
        print(trips.line(), flush=True)
    except (ScriptFailed, BrokerRefused, BrokerGone, BrokerGarbled, OSError) as failure:
        print(failure, file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
