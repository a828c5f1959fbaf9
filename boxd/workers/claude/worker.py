"""The Claude Code worker: Anthropic's Claude Code CLI on the task's prompt, its stream-json
events logged as steps.

It reads the task and its steps from the broker and runs `claude -p` in the workspace view
(boxd.workers.claude.config says with what), the prompt on its stdin, until Claude Code writes
its result and exits. Each meaningful event becomes a step holding Claude Code's session id;
started again (boxd restarted it after a power cut), it resumes the newest session (`--resume`),
so Claude Code carries on with its conversation, and the relay's keys make every box tool call
it repeats answer from the log instead of running twice; a planned task resumes in plan mode
unless its log holds the plan's acceptance. Its permission prompts go to the
relay's `box_permission` (boxd.workers.mcp.permission); what it was refused for want of
autonomy fails the task, as with Droid.
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
from pathlib import Path
from typing import Any

from boxd.claude.release import claude_binary
from boxd.workers.agent_config import RESUME_PROMPT
from boxd.workers.agent_events import last_session
from boxd.workers.agent_program import run_agent_worker
from boxd.workers.broker_client import BrokerClient
from boxd.workers.claude.config import command, environment, mcp_config
from boxd.workers.claude.events import Events, plan_accepted
from boxd.workers.droid.config import task_options
from boxd.workers.droid.worker import Steps, share_with_later_tasks

# One event is one line; a tool's result can be long.
MAX_EVENT_LINE = 64 * 1024 * 1024


class ClaudeFailed(Exception):
    pass


async def follow(stdout: asyncio.StreamReader, events: Events, steps: Steps) -> tuple[bool, str]:
    """Logs the run's steps as they come. Returns whether Claude Code finished the task, and
    the error it ended with if not ("" if it said nothing)."""
    error = ""
    finished = False
    while True:
        try:
            line = await stdout.readline()
        except ValueError as over:
            # asyncio's reader refuses a line longer than its limit; the stream cannot be
            # followed past it, so the run cannot be read to its end.
            raise ClaudeFailed(
                f"Claude Code wrote an event line over {MAX_EVENT_LINE // (1024 * 1024)} MiB, "
                "longer than the box reads, so the task was stopped there"
            ) from over
        if not line:
            break
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            # Not an event (Claude Code writes its warnings to stderr, but be lenient).
            continue
        if not isinstance(event, dict):
            continue
        seen = events.read(event)
        for step in seen.steps:
            await steps.log(step)
        error = error or seen.error or ""
        if seen.ended:
            finished = seen.finished
    return finished, error


async def run(socket_path: str, own_home: Path, work_dir: Path, gateway_url: str) -> None:
    async with BrokerClient(socket_path) as broker:
        state = await broker.task()
        task: dict[str, Any] = state["task"]
        resume = last_session(state["steps"])
        autonomy, plan = task_options(task)
        # Resumed, a planned task plans on until its plan was accepted.
        planning = plan and not plan_accepted(state["steps"])
        mcp = mcp_config(sys.executable, socket_path, autonomy, plan, home=own_home, work=work_dir)
        process = await asyncio.create_subprocess_exec(
            *command(
                claude_binary(),
                model=task["model"],
                autonomy=autonomy,
                plan=planning,
                mcp=mcp,
                resume=resume,
            ),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, **environment(own_home, gateway_url)},
            cwd=work_dir,
            limit=MAX_EVENT_LINE,
        )
        assert process.stdin is not None and process.stdout is not None
        prompt = RESUME_PROMPT if resume is not None else task["prompt"]
        process.stdin.write(prompt.encode())
        await process.stdin.drain()
        process.stdin.close()
        events = Events(task["model"], autonomy, resumed=resume is not None)
        steps = Steps(broker)
        try:
            finished, error = await follow(process.stdout, events, steps)
        except ClaudeFailed:
            process.kill()
            await process.wait()
            raise
        await steps.flush()
        status = await process.wait()
        await asyncio.to_thread(share_with_later_tasks, work_dir)
        if status != 0 or error or not finished:
            why = error or f"Claude Code exited with status {status} before it finished"
            raise ClaudeFailed(why if why.startswith("Claude Code") else f"Claude Code: {why}")


def main() -> None:
    run_agent_worker("claude", run, ClaudeFailed)


if __name__ == "__main__":
    main()
