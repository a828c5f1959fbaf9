"""Each task's own network namespace, `/run/netns/box-<id>`: loopback only.

The worker joins it (NetworkNamespacePath=), and systemd binds the task's proxy sockets inside
it on 127.0.0.1, so the only way out of it is through the broker. It lives in /run, outside any
process: it survives a boxd restart, and a machine restart clears it, which `ensure` redoes.
"""

import asyncio
from pathlib import Path

from boxd.errors import Problem, die
from boxd.manager.run import NotInstalled, run

NETNS_DIR = Path("/run/netns")
PREFIX = "box-"
# Where the task's HTTP proxy and SOCKS5 proxy listen inside its namespace.
HTTP_PROXY_PORT = 3128
SOCKS_PROXY_PORT = 1080
# Where the task's model gateway (the Anthropic Messages API, served by its broker) listens.
MODEL_GATEWAY_PORT = 3130


def netns_name(task_id: str) -> str:
    return f"{PREFIX}{task_id}"


def netns_path(task_id: str) -> Path:
    return NETNS_DIR / netns_name(task_id)


async def _ip(*argv: str) -> str | None:
    """Runs `ip`; returns its complaint, or None when it succeeded."""
    try:
        return (await run("ip", *argv)).complaint
    except NotInstalled:
        return "the ip command (iproute2) is not installed"


async def ensure(task_id: str) -> Path:
    """Makes the task's namespace with loopback up, or finds it already made. A leftover file
    that is not a namespace any more (a cut-off `ip netns add`) is replaced."""
    name = netns_name(task_id)
    path = netns_path(task_id)
    if await asyncio.to_thread(path.exists):
        if await _ip("-n", name, "link", "set", "lo", "up") is None:
            return path
        await _ip("netns", "delete", name)
    failed = await _ip("netns", "add", name)
    if failed:
        die(Problem.FAILED, f"could not make the task's network namespace {name}: {failed}")
    failed = await _ip("-n", name, "link", "set", "lo", "up")
    if failed:
        die(Problem.FAILED, f"could not bring up loopback in network namespace {name}: {failed}")
    return path


def task_ids() -> list[str]:
    """The tasks that have a namespace here. Blocking: call it off the event loop."""
    try:
        names = [path.name for path in NETNS_DIR.iterdir()]
    except FileNotFoundError:
        return []
    return [name.removeprefix(PREFIX) for name in names if name.startswith(PREFIX)]


async def remove(task_id: str) -> None:
    """Removes the namespace's name; the kernel frees it once the last process in it is gone."""
    name = netns_name(task_id)
    if not await asyncio.to_thread(netns_path(task_id).exists):
        return
    failed = await _ip("netns", "delete", name)
    if failed:
        die(Problem.FAILED, f"could not remove the task's network namespace {name}: {failed}")
