"""The Droid worker: Factory's Droid CLI on the task's prompt, its events logged as steps.

It reads the task and its steps from the broker, writes Droid's settings and MCP servers into
the task's own HOME, and runs `droid exec` in the workspace view. Each meaningful event becomes
a step holding Droid's session id; started again (boxd restarted it after a power cut), it forks
the newest session, so Droid carries on with its conversation, and the relay's keys make every
tool call it repeats answer from the log instead of running twice.
"""

import asyncio
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import aiohttp

from boxd.droid_release import droid_binary
from boxd.workers.broker_client import BrokerClient, BrokerRefused
from boxd.workers.droid_config import (
    AIRGAP_ENVIRONMENT,
    RESUME_PROMPT,
    command,
    factory_dir,
    mcp_servers,
    settings,
    task_options,
)
from boxd.workers.droid_events import Kind, last_session, read_event

# One event is one line; a tool's result can be long.
MAX_EVENT_LINE = 64 * 1024 * 1024


class DroidFailed(Exception):
    pass


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)


def prepare_home(own_home: Path, task: dict[str, Any], gateway_url: str, socket: str) -> Path:
    """Droid's configuration in the task's own HOME; returns the prompt file."""
    factory = factory_dir(own_home)
    _write_private(factory / "settings.json", json.dumps(settings(task["model"], gateway_url)))
    _write_private(factory / "mcp.json", json.dumps(mcp_servers(sys.executable, socket)))
    return factory / "box-prompt.md"


def share_with_later_tasks(work_dir: Path) -> None:
    """Droid writes new files 0600. Every task is its own user in group boxd-work, and a later
    task must be able to change what this one left, as with every other worker's files: the
    group gets what the owner has. Only this task's own files, never through a link."""
    uid = os.getuid()
    for root, dirs, files in os.walk(work_dir):
        for name in dirs + files:
            path = os.path.join(root, name)
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            if info.st_uid != uid or stat.S_ISLNK(info.st_mode):
                continue
            owner_bits = (info.st_mode & stat.S_IRWXU) >> 3
            wanted = stat.S_IMODE(info.st_mode) | owner_bits
            if wanted != stat.S_IMODE(info.st_mode):
                os.chmod(path, wanted, follow_symlinks=False)


class Steps:
    """Logs steps in order. Droid's last message is also its final text: held back one event, so
    the summary does not repeat it as a second step."""

    def __init__(self, broker: BrokerClient) -> None:
        self._broker = broker
        self._held: dict[str, Any] | None = None

    async def log(self, step: dict[str, Any]) -> None:
        held, self._held = self._held, None
        if held is not None and not (
            step["data"]["kind"] == Kind.SUMMARY and step["text"] == held["text"]
        ):
            await self._broker.post("/step", held)
        if step["data"]["kind"] == Kind.MESSAGE:
            self._held = step
        else:
            await self._broker.post("/step", step)

    async def flush(self) -> None:
        if self._held is not None:
            await self._broker.post("/step", self._held)
            self._held = None


async def run(socket_path: str, own_home: Path, work_dir: Path, gateway_url: str) -> None:
    async with BrokerClient(socket_path) as broker:
        state = await broker.get("/task")
        task = state["task"]
        fork = last_session(state["steps"])
        prompt_file = await asyncio.to_thread(
            prepare_home, own_home, task, gateway_url, socket_path
        )
        await asyncio.to_thread(
            prompt_file.write_text, RESUME_PROMPT if fork else task["prompt"], "utf-8"
        )
        autonomy, plan = task_options(task)
        argv = command(
            droid_binary(),
            autonomy=autonomy,
            plan=plan,
            work_dir=work_dir,
            prompt_file=prompt_file,
            fork=fork,
        )
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, **AIRGAP_ENVIRONMENT},
            cwd=work_dir,
            limit=MAX_EVENT_LINE,
        )
        assert process.stdout is not None
        steps = Steps(broker)
        error: str | None = None
        finished = False
        async for line in process.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                print(f"droid said: {line.decode(errors='replace').rstrip()}", file=sys.stderr)
                continue
            seen = read_event(event, task["model"], resumed=fork is not None)
            if seen.step is not None:
                await steps.log(seen.step)
            # Droid's first error says why (its agent loop's, with the API's words); the last
            # one is only "Exec failed".
            error = error or seen.error
            finished = finished or seen.finished
        await steps.flush()
        status = await process.wait()
        await asyncio.to_thread(share_with_later_tasks, work_dir)
        if status != 0 or error is not None or not finished:
            why = error or f"Droid exited with status {status} before it finished"
            raise DroidFailed(f"Droid stopped: {why}")


def main() -> None:
    socket_path = os.environ.get("BOX_SOCKET")
    gateway_url = os.environ.get("BOX_MODEL_URL")
    home = os.environ.get("HOME")
    if not socket_path or not gateway_url or not home:
        sys.exit(
            "droid worker: BOX_SOCKET, BOX_MODEL_URL and HOME must be set; "
            "boxd starts this worker for a task"
        )
    try:
        asyncio.run(run(socket_path, Path(home), Path.cwd(), gateway_url))
    except (DroidFailed, BrokerRefused, OSError, aiohttp.ClientError) as failure:
        print(failure, file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
