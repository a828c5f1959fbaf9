"""What a run of the checks cut off left (boxd killed mid-run, a `boxd doctor` interrupted): its
probe unit, its network namespace, its trial stack of layers, perhaps still mounted. Each is
named for the process that made it (`<pid>-<random>`), so a run clears only those of processes
that are gone, never those of a run under way beside it."""

import asyncio
import logging
import os
import secrets
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from boxd.manager.units.netns import NETNS_DIR
from boxd.reading.decimal_text import decimal

log = logging.getLogger(__name__)

NETNS_PREFIX = "boxd-doctor-"
UNIT_PREFIX = "boxd-doctor-bpf-"
STACK_PREFIX = ".doctor-"


def token() -> str:
    """A name for one run's trial, with this process's id first."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def _gone(tail: str) -> bool:
    """Whether the process a trial's name starts with has ended."""
    pid = tail.split("-", 1)[0]
    number = decimal(pid, most_digits=10)
    if number is None:
        return False
    try:
        os.kill(number, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Units(Protocol):
    async def loaded_units(self, pattern: str) -> list[str]: ...

    async def stop_unit(self, name: str) -> None: ...

    async def reset_failed(self, name: str) -> None: ...


async def clear(
    home: Path,
    systemd: Units,
    command: Callable[..., Awaitable[str | None]],
    netns_dir: Path = NETNS_DIR,
) -> None:
    """Removes the trials of runs whose process is gone. `command` runs a command and answers
    its complaint or None."""
    for unit in await systemd.loaded_units(f"{UNIT_PREFIX}*"):
        if _gone(unit.removeprefix(UNIT_PREFIX)):
            await systemd.stop_unit(unit)
            await systemd.reset_failed(unit)

    def names(place: Path, prefix: str) -> list[str]:
        try:
            return [n for n in os.listdir(place) if n.startswith(prefix)]
        except FileNotFoundError:
            return []

    for name in await asyncio.to_thread(names, netns_dir, NETNS_PREFIX):
        if _gone(name.removeprefix(NETNS_PREFIX)):
            await command("ip", "netns", "delete", name)
    for name in await asyncio.to_thread(names, home, STACK_PREFIX):
        if _gone(name.removeprefix(STACK_PREFIX)):
            view = home / name / "view"
            if await asyncio.to_thread(os.path.ismount, view):
                await command("umount", "--lazy", str(view))
            log.info("removing %s, left by a check of this machine cut off", home / name)
            await asyncio.to_thread(shutil.rmtree, home / name, True)
