"""Starting boxd.manager.as_owner with a folder owner's credentials, and talking to it.

subprocess sets the groups, gid and uid in the child between fork and exec, so nothing of
root's is left in it. Its environment is empty but for PATH, LANG and the test-only pause
folder; -I keeps the owner's site, startup and PYTHON* settings out of it. What it sends is
treated as the owner's words, never trusted: names are checked, every write into boxd's own
tree goes through beneath.py too.
"""

import contextlib
import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import boxd
from boxd.manager.folder_stream import Reader, Writer
from boxd.manager.pause import VARIABLE

# The interpreter and the folder boxd's package is in: -I leaves PYTHONPATH out, so the child
# is told where to import boxd from. Tests that run as root swap in an interpreter the folder's
# owner may run.
PYTHON = sys.executable
PACKAGES = str(Path(boxd.__file__).resolve().parent.parent)
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); from boxd.manager.as_owner import main; "
    "sys.exit(main(sys.argv[2:]))"
)


class OwnerError(Exception):
    """The process as the owner could not be started, or ended without saying why."""


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
        self.writer = Writer(self._process.stdin)
        self.reader = Reader(self._process.stdout)

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
