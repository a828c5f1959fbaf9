"""The one way the manager runs a command: without blocking the event loop, and with what went
wrong in words a person can act on."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class Ran:
    """A command that ran to its end."""

    command: str
    status: int
    stdout: bytes
    stderr: bytes

    @property
    def complaint(self) -> str | None:
        """None when it succeeded; else what it said on stderr, or its exit status when it
        said nothing (an empty complaint would read as success)."""
        if self.status == 0:
            return None
        said = self.stderr.decode(errors="replace").strip()
        return said or f"{self.command} exited with status {self.status}"


class NotInstalled(OSError):
    """The command is not on this machine; the message names it."""


async def run(
    *argv: str,
    cwd: Path | None = None,
    input: bytes | None = None,
    keep_output: bool = False,
    env: Mapping[str, str] | None = None,
) -> Ran:
    """Runs `argv` to its end; its stdout is kept only when asked for, and `env` is added to the
    manager's environment for it. Raises NotInstalled when there is no such command.

    Cancelled (a time limit, the manager stopping), it kills the command rather than leave it
    running unwatched, and does not wait for it to go: one stuck in the kernel (a mount of a
    file system that does not answer) goes only when the kernel lets it, and asyncio reaps it
    then."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=None if env is None else {**os.environ, **env},
            stdin=asyncio.subprocess.DEVNULL if input is None else asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE if keep_output else asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except FileNotFoundError:
        raise NotInstalled(f"the command {argv[0]} is not installed") from None
    try:
        stdout, stderr = await process.communicate(input)
    except asyncio.CancelledError:
        if process.returncode is None:
            process.kill()
        raise
    assert process.returncode is not None
    return Ran(argv[0], process.returncode, stdout or b"", stderr or b"")


class Runner(Protocol):
    """What runs commands as `run` does: `run` itself, or the unit tests' fakes of it."""

    async def __call__(
        self,
        *argv: str,
        cwd: Path | None = None,
        input: bytes | None = None,
        keep_output: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> Ran: ...


async def complaint(
    *argv: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    runner: Runner = run,
) -> str | None:
    """Runs `argv` (by `runner`); None when it succeeded, else why not (a command not
    installed included)."""
    try:
        return (await runner(*argv, cwd=cwd, env=env)).complaint
    except NotInstalled as missing:
        return str(missing)
