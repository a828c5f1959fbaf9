"""Each task runs as its own persistent system user, box-<id>.

Not DynamicUser: the task's files outlive its units, and a recycled uid would hand them to a
later task. useradd locks /etc/passwd, so creations are serialized.
"""

import asyncio
import pwd
from pathlib import Path

from boxd.errors import Problem, die

_lock = asyncio.Lock()


def user_ids(name: str) -> tuple[int, int] | None:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def user_name(uid: int) -> str:
    """The account name for the log, or the number when the account has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


async def ensure_user(name: str, home: Path) -> tuple[int, int]:
    async with _lock:
        ids = user_ids(name)
        if ids is not None:
            return ids
        process = await asyncio.create_subprocess_exec(
            "useradd",
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            str(home),
            "--shell",
            "/usr/sbin/nologin",
            "--comment",
            "boxd task",
            name,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await process.communicate()
        if process.returncode != 0:
            die(Problem.FAILED, f"could not create user {name}: {stderr.decode().strip()}")
    ids = user_ids(name)
    if ids is None:
        die(Problem.FAILED, f"useradd made {name}, but the system cannot find it")
    return ids
