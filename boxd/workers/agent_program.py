"""How an agent's worker runs as a program: the environment boxd starts it with, checked, and
its failure printed for the task's log.

The Droid and Claude Code workers (`python -m boxd.workers.droid.worker`, `...claude.worker`)
start the same way and end the same way; each names itself and its own failure.
"""

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from boxd.workers.broker_client import BrokerGarbled, BrokerGone, BrokerRefused

# A worker's run: the broker's socket, the worker's own HOME, the workspace view it runs in, the
# model gateway's URL.
AgentRun = Callable[[str, Path, Path, str], Coroutine[Any, Any, None]]


def run_agent_worker(name: str, run: AgentRun, failed: type[Exception]) -> None:
    """Runs `run` with what boxd started the worker with; a failure (the worker's own `failed`,
    the broker's, the system's) is printed on stderr, where the task's log takes it, and the
    program exits 1."""
    socket_path = os.environ.get("BOX_SOCKET")
    gateway_url = os.environ.get("BOX_MODEL_URL")
    home = os.environ.get("HOME")
    if not socket_path or not gateway_url or not home:
        sys.exit(
            f"{name} worker: BOX_SOCKET, BOX_MODEL_URL and HOME must be set; "
            "boxd starts this worker for a task"
        )
    try:
        asyncio.run(run(socket_path, Path(home), Path.cwd(), gateway_url))
    except (failed, BrokerRefused, BrokerGone, BrokerGarbled, OSError) as failure:
        print(failure, file=sys.stderr, flush=True)
        sys.exit(1)
