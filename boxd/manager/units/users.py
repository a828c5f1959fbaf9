"""Each task runs as its own user, box-<id>, with a uid from a range of boxd's own.

Not DynamicUser: the task's files outlive its units, and a recycled uid would hand them to a
later task. Not the system range (100-999) either: it holds some 850 users, fewer than the tasks
a box runs in a week. The uids come from 0x70000000-0x7FFDFFFF, which systemd's UIDS-GIDS.md
leaves unused (above its container ranges, below its foreign range and below 2^31, where
signedness bugs live) and which is far above the subordinate ids useradd hands out (100000 to
600100000). The store hands them out in order and never twice, so a user can be removed once
its task has ended and nothing of its own is left on the box that anyone still looks at: a
file left behind with its bare number still belongs to no one else.

useradd and userdel lock /etc/passwd, so changes are serialized.
"""

import asyncio
import grp
import pwd
from collections.abc import Awaitable, Callable
from pathlib import Path

from boxd.errors import Problem, die
from boxd.manager.run import complaint

FIRST_UID = 0x7000_0000
LAST_UID = 0x7FFD_FFFF

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


def id_taken(number: int) -> bool:
    """Whether a user or a group already has this number (made by someone other than boxd)."""
    try:
        pwd.getpwuid(number)
        return True
    except KeyError:
        pass
    try:
        grp.getgrgid(number)
        return True
    except KeyError:
        return False


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


async def task_uid(name: str, claim_uid: Callable[[], Awaitable[int]]) -> int:
    """The uid of the task's user: the one it has if it was made already (ahead, as a spare, or
    before boxd restarted), or the one `claim_uid` hands out. Known before the user is made, so
    the task's files can be given to it while useradd runs: no one else ever gets that number."""
    ids = await asyncio.to_thread(user_ids, name)
    return ids[0] if ids is not None else await claim_uid()


async def _made(name: str, uid: int) -> bool:
    ids = await asyncio.to_thread(user_ids, name)
    if ids is not None and ids[0] != uid:
        die(Problem.FAILED, f"user {name} has uid {ids[0]}, not the {uid} boxd gave it")
    return ids is not None


async def ensure_user(name: str, home: Path, uid: int) -> None:
    """Makes the user with this uid (and its group, same number), unless it is there."""
    # Looked for before the lock too: a user made ahead (spares.py) need not wait for the
    # useradd of another.
    if await _made(name, uid):
        return
    async with _lock:
        if await _made(name, uid):
            return
        if not await asyncio.to_thread(_group_exists, name):
            failed = await complaint("groupadd", "--system", "--gid", str(uid), name)
            if failed:
                die(Problem.FAILED, f"could not create group {name}: {failed}")
        failed = await complaint(
            "useradd",
            # --system: no subordinate uids (65536 each) for a user that never logs in.
            "--system",
            # No lastlog/faillog entry: at a uid near 2^31 those sparse files would claim
            # hundreds of gigabytes.
            "--no-log-init",
            "--uid",
            str(uid),
            "--gid",
            name,
            "--no-create-home",
            "--home-dir",
            str(home),
            "--shell",
            "/usr/sbin/nologin",
            "--comment",
            "boxd task",
            name,
        )
        if failed:
            die(Problem.FAILED, f"could not create user {name}: {failed}")
    if await asyncio.to_thread(user_ids, name) is None:
        die(Problem.FAILED, f"useradd made {name}, but the system cannot find it")


async def ensure_system_user(name: str, comment: str) -> None:
    """Makes a system user of that name, with a group of its own, unless it is there: one that
    runs a service and owns nothing outside it (an app's runner)."""
    async with _lock:
        if await asyncio.to_thread(user_ids, name) is not None:
            return
        failed = await complaint(
            "useradd",
            "--system",
            "--user-group",
            "--no-log-init",
            "--no-create-home",
            "--home-dir",
            "/",
            "--shell",
            "/usr/sbin/nologin",
            "--comment",
            comment,
            name,
        )
        if failed:
            die(Problem.FAILED, f"could not create user {name}: {failed}")


async def remove_user(name: str) -> str | None:
    """Removes the task's user and its group, if they are there; returns why it could not."""
    async with _lock:
        if await asyncio.to_thread(user_ids, name) is not None:
            failed = await complaint("userdel", name)
            if failed:
                return f"could not remove user {name}: {failed}"
        # userdel takes the user's own group along; one left by a cut-off useradd may remain.
        if await asyncio.to_thread(_group_exists, name):
            failed = await complaint("groupdel", name)
            if failed:
                return f"could not remove group {name}: {failed}"
    return None
