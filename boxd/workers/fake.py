"""The fake worker: the prompt is a script, one command per line, no model.

After each finished line it logs a step with `data: {"line": N}`; started again, it skips the
lines already logged, as a real worker resumes from its steps.
"""

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from boxd.workers.broker_client import BrokerClient, BrokerRefused

MAX_OUTPUT = 4000


class ScriptFailed(Exception):
    pass


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


async def _sleep(argument: str) -> str:
    try:
        seconds = float(argument)
    except ValueError:
        raise ScriptFailed(f"sleep needs a number of seconds, not {argument!r}") from None
    await asyncio.sleep(seconds)
    return f"slept {argument} s"


async def _fail(argument: str) -> str:
    raise ScriptFailed(argument or "the script said fail")


COMMANDS: dict[str, Callable[[str], Awaitable[str]]] = {
    "step": _step,
    "write": _write,
    "delete": _delete,
    "sh": _sh,
    "sleep": _sleep,
    "fail": _fail,
}
# Commands of DESIGN.md that need the broker's tools, approvals, cost or network.
NOT_YET = ("call", "ask", "cost", "usage", "fetch")


def last_line_done(steps: list[dict[str, Any]]) -> int:
    lines = [
        step["data"]["line"]
        for step in steps
        if isinstance(step.get("data"), dict) and isinstance(step["data"].get("line"), int)
    ]
    return max(lines, default=0)


async def run(socket_path: str) -> None:
    async with BrokerClient(socket_path) as broker:
        state = await broker.get("/task")
        done = last_line_done(state["steps"])
        for number, line in enumerate(state["task"]["prompt"].splitlines(), start=1):
            command, _, argument = line.strip().partition(" ")
            if number <= done or not command or command.startswith("#"):
                continue
            if command in NOT_YET:
                raise ScriptFailed(f"line {number}: {command} is not available on this box yet")
            if command not in COMMANDS:
                raise ScriptFailed(f"line {number}: unknown command {command!r}")
            try:
                text = await COMMANDS[command](argument.strip())
            except ScriptFailed as failure:
                raise ScriptFailed(f"line {number}: {failure}") from None
            await broker.post("/step", {"text": text, "data": {"line": number}})


def main() -> None:
    socket_path = os.environ.get("BOX_SOCKET")
    if not socket_path:
        sys.exit("fake worker: BOX_SOCKET is not set; boxd starts this worker for a task")
    try:
        asyncio.run(run(socket_path))
    except (ScriptFailed, BrokerRefused, OSError, aiohttp.ClientError) as failure:
        print(failure, file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
