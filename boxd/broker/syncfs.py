"""syncfs(2): flush the file system that holds a task's files before a step is logged.

Python's os module has sync() and fsync() but not syncfs(); sync() would flush every disk of
the machine for one task's step.
"""

import asyncio
import ctypes
import os
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)


def _syncfs(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _libc.syncfs(fd) != 0:
            number = ctypes.get_errno()
            raise OSError(number, f"syncfs on {path} failed: {os.strerror(number)}")
    finally:
        os.close(fd)


async def syncfs(path: Path) -> None:
    await asyncio.to_thread(_syncfs, path)
