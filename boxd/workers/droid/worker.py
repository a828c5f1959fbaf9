"""The Droid worker: Factory's Droid CLI on the task's prompt, its events logged as steps.

It reads the task and its steps from the broker, writes Droid's settings and MCP servers into
the task's own HOME, and runs `droid exec` in the workspace view, driven over JSON-RPC
(boxd.workers.droid.rpc): one session, the task's prompt as its one user message, until Droid
ends the turn. Each meaningful notification becomes a step holding Droid's session id; started
again (boxd restarted it after a power cut), it loads the newest session, so Droid carries on
with its conversation, and the relay's keys make every tool call it repeats answer from the log
instead of running twice. Droid's questions to its user become the owner's approvals, and what
it asks permission for beyond the task's autonomy is refused (boxd.workers.droid.answers).
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
import stat
import sys
from pathlib import Path
from typing import Any

from boxd.droid.release import droid_binary
from boxd.workers.agent_config import RESUME_PROMPT
from boxd.workers.agent_events import Kind, last_session
from boxd.workers.agent_program import run_agent_worker
from boxd.workers.broker_client import BrokerClient
from boxd.workers.droid.answers import Answers
from boxd.workers.droid.config import (
    AIRGAP_ENVIRONMENT,
    DISABLED_TOOLS,
    MODEL_CHOICE,
    command,
    factory_dir,
    mcp_servers,
    settings,
    task_options,
)
from boxd.workers.droid.events import Notifications
from boxd.workers.droid.rpc import DroidRpc, DroidRpcError

# One message is one line; a tool's result can be long.
MAX_EVENT_LINE = 64 * 1024 * 1024


class DroidFailed(Exception):
    pass


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)


def prepare_home(own_home: Path, task: dict[str, Any], gateway_url: str, socket: str) -> None:
    """Droid's configuration in the task's own HOME."""
    factory = factory_dir(own_home)
    _write_private(factory / "settings.json", json.dumps(settings(task["model"], gateway_url)))
    _write_private(factory / "mcp.json", json.dumps(mcp_servers(sys.executable, socket)))


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
            await self._broker.step(held["text"], held["data"])
        if step["data"]["kind"] == Kind.MESSAGE:
            self._held = step
        else:
            await self._broker.step(step["text"], step["data"])

    async def flush(self) -> None:
        if self._held is not None:
            await self._broker.step(self._held["text"], self._held["data"])
            self._held = None


async def converse(
    rpc: DroidRpc,
    steps: Steps,
    *,
    task: dict[str, Any],
    work_dir: Path,
    resume: str | None,
    answers: Answers,
) -> tuple[bool, str | None]:
    """One turn of one session: the prompt (or, resumed, the word to carry on) until Droid ends
    the turn. Returns whether it finished and the error it ended with, if any."""
    autonomy, plan = answers.autonomy, answers.plan
    session: Any = resume
    if resume is not None:
        await rpc.load_session(resume, autonomy=autonomy, disabled=DISABLED_TOOLS)
    else:
        started = await rpc.initialize_session(
            title=str(task.get("title") or task.get("id") or ""),
            cwd=str(work_dir),
            model=MODEL_CHOICE,
            autonomy=autonomy,
            spec=plan,
            disabled=DISABLED_TOOLS,
        )
        session = started.get("sessionId")
    if not isinstance(session, str) or not session:
        return False, "Droid started no session"
    notifications = Notifications(session, task["model"])
    await steps.log(notifications.started(resumed=resume is not None))
    await rpc.add_user_message(RESUME_PROMPT if resume is not None else task["prompt"])
    error: str | None = None
    while (notification := await rpc.notification()) is not None:
        seen = notifications.read(notification)
        if answers.refused:
            # Droid ends its turn as "completed" after a refusal: it did not finish the task.
            why = "; ".join(answers.refused)
            await steps.log(notifications.refusal(why))
            return False, why
        for step in seen.steps:
            await steps.log(step)
        error = error or seen.error
        if seen.ended:
            return seen.finished, error
    return False, error


async def run(socket_path: str, own_home: Path, work_dir: Path, gateway_url: str) -> None:
    async with BrokerClient(socket_path) as broker:
        state = await broker.task()
        task = state["task"]
        resume = last_session(state["steps"])
        await asyncio.to_thread(prepare_home, own_home, task, gateway_url, socket_path)
        autonomy, plan = task_options(task)
        answers = Answers(broker.post, autonomy=autonomy, plan=plan)
        process = await asyncio.create_subprocess_exec(
            *command(droid_binary(), autonomy=autonomy, work_dir=work_dir),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, **AIRGAP_ENVIRONMENT},
            cwd=work_dir,
            limit=MAX_EVENT_LINE,
        )
        assert process.stdin is not None and process.stdout is not None
        rpc = DroidRpc(process.stdout, process.stdin, answers)
        serving = asyncio.create_task(rpc.serve())
        steps = Steps(broker)
        try:
            finished, error = await converse(
                rpc,
                steps,
                task=task,
                work_dir=work_dir,
                resume=resume,
                answers=answers,
            )
        except DroidRpcError as failure:
            finished, error = False, str(failure)
        finally:
            # Droid ends its session and exits when its input ends.
            process.stdin.close()
        await steps.flush()
        status = await process.wait()
        await serving
        await asyncio.to_thread(share_with_later_tasks, work_dir)
        if status != 0 or error is not None or not finished:
            why = error or f"Droid exited with status {status} before it finished"
            raise DroidFailed(f"Droid stopped: {why}")


def main() -> None:
    run_agent_worker("droid", run, DroidFailed)


if __name__ == "__main__":
    main()
