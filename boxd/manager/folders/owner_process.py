"""Starting boxd.manager.folders.as_owner with a folder owner's credentials, and talking to it.

subprocess sets the groups, gid and uid in the child between fork and exec, so nothing of
root's is left in it. Its environment is empty but for PATH, LANG and the test-only pause
folder; -I keeps the owner's site, startup and PYTHON* settings out of it. What it sends is
treated as the owner's words, never trusted: names are checked, every write into boxd's own
tree goes through beneath.py too.
"""

import asyncio
import contextlib
import functools
import os
import pwd
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

import boxd
from boxd.manager.folders.folder_stream import Reader, Writer
from boxd.manager.folders.pause import VARIABLE

# The interpreter and the folder boxd's package is in: -I leaves PYTHONPATH out, so the child
# is told where to import boxd from. Tests that run as root swap in an interpreter the folder's
# owner may run.
PYTHON = sys.executable
PACKAGES = str(Path(boxd.__file__).resolve().parent.parent)
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); from boxd.manager.folders.as_owner import main; "
    "sys.exit(main(sys.argv[2:]))"
)


# A process that runs as an account is that account's to stop (SIGSTOP), or to leave waiting
# on a folder that never answers (FUSE): one that moves no byte either way for this long is
# killed. A file of any size moves some every second.
STALL_SECONDS = 60.0
# The work done through such processes runs on threads of its own: stalled ones hold these,
# never the threads the rest of boxd works on.
OWNER_WORKERS = 4
_work = ThreadPoolExecutor(max_workers=OWNER_WORKERS, thread_name_prefix="as-owner")

T = TypeVar("T")


async def as_owner_work(work: Callable[..., T], *args: Any) -> T:
    """Runs `work` (which starts OwnerProcesses) off the event loop, on the threads kept for
    such work."""
    return await asyncio.get_running_loop().run_in_executor(_work, functools.partial(work, *args))


class OwnerError(Exception):
    """The process as the owner could not be started, or ended without saying why."""


class _Moving:
    """A pipe's end that notes when bytes last went through it."""

    def __init__(self, pipe: IO[bytes], moved: Callable[[], None]) -> None:
        self._pipe = pipe
        self._moved = moved

    def readline(self, limit: int = -1, /) -> bytes:
        line = self._pipe.readline(limit)
        self._moved()
        return line

    def read(self, size: int = -1, /) -> bytes:
        data = self._pipe.read(size)
        self._moved()
        return data

    def write(self, data: bytes, /) -> int:
        written = self._pipe.write(data)
        self._moved()
        return written

    def flush(self) -> None:
        self._pipe.flush()
        self._moved()


def account_of(uid: int) -> pwd.struct_passwd:
    try:
        return pwd.getpwuid(uid)
    except KeyError:
        raise OwnerError(f"it belongs to uid {uid}, which has no account on this box") from None


class OwnerProcess:
    def __init__(self, uid: int, verb: str, folder: str) -> None:
        account = account_of(uid)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        if os.environ.get(VARIABLE):
            env[VARIABLE] = os.environ[VARIABLE]
        who: dict[str, Any] = {}
        if os.geteuid() == 0:
            groups = os.getgrouplist(account.pw_name, account.pw_gid)
            who = {"user": uid, "group": account.pw_gid, "extra_groups": groups}
        elif uid != os.geteuid():
            raise OwnerError(f"boxd runs as uid {os.geteuid()} and cannot act as uid {uid}")
        # Closed in __exit__; a file, not a pipe, so a chatty failure cannot block it.
        self._errors: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        argv = [PYTHON, "-I", "-c", _BOOT, PACKAGES, verb, folder, str(uid)]
        self._process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            cwd="/",
            env=env,
            umask=0o077,
            close_fds=True,
            **who,
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        self._moved_at = time.monotonic()
        self.writer = Writer(_Moving(self._process.stdin, self._moved))
        self.reader = Reader(_Moving(self._process.stdout, self._moved))
        self.stalled = False
        threading.Thread(target=self._watch, name="as-owner-watch", daemon=True).start()

    def _moved(self) -> None:
        self._moved_at = time.monotonic()

    def _watch(self) -> None:
        """Kills the process once no byte went either way for STALL_SECONDS: the thread that
        waits on it then reads its end."""
        while self._process.poll() is None:
            if time.monotonic() - self._moved_at > STALL_SECONDS:
                self.stalled = True
                with contextlib.suppress(ProcessLookupError):
                    self._process.kill()
                return
            time.sleep(min(1.0, STALL_SECONDS / 4))

    def close_input(self) -> None:
        stdin = self._process.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                stdin.close()

    def finish(self) -> int:
        """Waits for it to end; its status."""
        self.close_input()
        return self._process.wait()

    def complaint(self) -> str:
        """The last line it wrote to stderr (a traceback's), for an error nobody foresaw."""
        if self.stalled:
            return (
                f"it moved nothing for {STALL_SECONDS:g} s (stopped, or waiting on a folder "
                "that does not answer), so boxd ended it"
            )
        self._errors.seek(0)
        lines = self._errors.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else f"it ended with status {self._process.returncode}"

    def __enter__(self) -> "OwnerProcess":
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._process.poll() is None:
            self._process.kill()
        self.close_input()
        self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._errors.close()
