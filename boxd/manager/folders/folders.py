"""Personal folders: real folders of the owner that a task works on a copy of.

A folder must be in the home of the account that asks or in Settings agentFolders, must belong
to that account (root may ask for anyone's but root's), and can never be the system or the box's
own state. Links are followed to where they really go, by a process running as the account that
asks (so root's rights never show it what lies beyond them), and the rules apply there: a link
in the owner's home that points into BOX_HOME is the box's state.

The account that asks is recorded on the task (`askerUid`): the mirror is read and keep writes
as it (mirror.py, keep.py), and only it or root reviews and keeps the task. Several members of
boxd-owner share one box; none of them gets another's files through a task.
"""

import hashlib
import pwd
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from boxd.errors import Problem, die
from boxd.manager.folders.folder_stream import StreamError
from boxd.manager.folders.owner_process import OwnerError, OwnerProcess
from boxd.manager.units.users import user_name
from boxd.wire.caller import Caller

# Never an agent's, wherever a link or a setting points: the system and its state.
SYSTEM = tuple(
    Path(p)
    for p in (
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/lib",
        "/lib32",
        "/lib64",
        "/proc",
        "/root",
        "/run",
        "/sbin",
        "/sys",
        "/usr",
        "/var/lib",
        "/var/log",
    )
)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Folder:
    """A checked real folder: where it really is, and the name the task sees it by."""

    path: Path
    name: str


@dataclass(frozen=True)
class Account:
    """The account that asks for a personal task."""

    uid: int
    name: str
    home: Path | None


@dataclass(frozen=True)
class Looked:
    """What the account that asks found at a path it named: where it really leads, whether that
    is a folder, its owner, and why the account cannot open and list it, if it cannot."""

    real: Path
    folder: bool
    owner: int
    unreadable: str | None = None


class LookFailed(Exception):
    """The path leads nowhere the account can follow; the words say why."""


Look = Callable[[str], Looked]


def caller_uid(caller: Caller) -> int | None:
    """The uid of the account behind a call: the D-Bus caller's, or the account that made the
    token or screen session, by its name. None when the call does not say, or that account is
    gone."""
    if caller.uid is not None:
        return caller.uid
    if caller.user is None:
        return None
    try:
        return pwd.getpwnam(caller.user).pw_uid
    except KeyError:
        return None


def asking_account(caller: Caller) -> Account:
    """The account a personal task is asked for by, or a refusal in words."""
    uid = caller_uid(caller)
    if uid is None:
        why = (
            f"the account {caller.user} that made it is no longer on this box"
            if caller.user is not None
            else "it does not say which account made it (it is older than boxd's record of that)"
        )
        die(
            Problem.FORBIDDEN,
            f"a task on personal folders works as the account that asks for it, and {why}: "
            "make a new token with boxctl token create, as that account",
        )
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        die(
            Problem.FORBIDDEN,
            f"your account (uid {uid}) has no entry in this box's accounts, so no task can "
            "work on folders as it",
        )
    return Account(uid, entry.pw_name, Path(entry.pw_dir) if entry.pw_dir else None)


def look_as(uid: int, asked: str) -> Looked:
    """Follows `asked` to where it leads, as the account `uid` (as_owner.py's `look`)."""
    try:
        with OwnerProcess(uid, "look", asked) as child:
            child.close_input()
            answer = child.reader.record()
            status = child.finish()
            complaint = child.complaint()
    except (OwnerError, StreamError, OSError, ValueError) as error:
        raise LookFailed(f"it could not be looked at as your account ({error})") from None
    if answer is None:
        raise LookFailed(f"it could not be looked at as your account ({complaint})")
    if answer.get("missing") is True:
        raise LookFailed("there is no such folder")
    if isinstance(answer.get("error"), str):
        raise LookFailed(f"it cannot be followed to a real folder ({answer['error']})")
    real, folder, owner = answer.get("real"), answer.get("folder"), answer.get("owner")
    unreadable = answer.get("unreadable")
    if (
        status != 0
        or not isinstance(real, str)
        or not real.startswith("/")
        or not isinstance(folder, bool)
        or not isinstance(owner, int)
        or not (unreadable is None or isinstance(unreadable, str))
    ):
        raise LookFailed(f"it could not be looked at as your account ({complaint})")
    return Looked(Path(real), folder, owner, unreadable)


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _refuse(asked: str, why: str) -> NoReturn:
    die(Problem.INVALID, f"folder {asked}: {why}")


def check_folder(
    asked: str, account: Account, agent_folders: list[str], box_home: Path, look: Look
) -> Path:
    """Returns the folder's real path, or refuses it in words the owner can act on. `look`
    follows the path as the account that asks."""
    try:
        found = look(asked)
    except LookFailed as failed:
        _refuse(asked, str(failed))
    real = found.real
    where = "" if str(real) == asked.rstrip("/") else f" (a link to {real})"
    if not found.folder:
        _refuse(asked, f"it is not a folder{where}")
    box_state = box_home.resolve()
    if _inside(real, box_state) or _inside(box_state, real):
        _refuse(asked, f"it holds the box's own state{where}; agents never work on that")
    for system in SYSTEM:
        if real == Path("/") or _inside(real, system):
            _refuse(asked, f"it is part of the system{where}; agents never work on that")
    allowed = [Path(f).resolve() for f in agent_folders]
    home = account.home
    in_home = home is not None and real != home.resolve() and _inside(real, home.resolve())
    if not in_home and not any(_inside(real, folder) for folder in allowed):
        yours = f"your home folder ({home})" if home is not None else "your home folder"
        _refuse(asked, f"it is not in {yours} or in Settings agentFolders{where}")
    if found.owner == 0:
        _refuse(asked, f"it belongs to root{where}; agents may not use root's folders")
    if account.uid not in (0, found.owner):
        _refuse(
            asked,
            f"it belongs to {user_name(found.owner)}, not to your account ({account.name})"
            f"{where}; only root may start a task on another account's folder",
        )
    if found.unreadable is not None:
        _refuse(
            asked,
            f"your account ({account.name}) cannot read it itself ({found.unreadable}); "
            "agents may not either",
        )
    return real


def check_folders(
    asked: list[str], account: Account, agent_folders: list[str], box_home: Path, look: Look
) -> list[Folder]:
    """Checks every folder; they must be distinct, not inside each other, and named apart, since
    they show up side by side, each under its real folder's name."""
    folders: list[Folder] = []
    for path in asked:
        real = check_folder(path, account, agent_folders, box_home, look)
        for other in folders:
            if _inside(real, other.path) or _inside(other.path, real):
                _refuse(path, f"it overlaps {other.path}, also given; name each folder once")
            if other.name == real.name:
                _refuse(
                    path,
                    f"it has the same name as {other.path}; folders show up side by side by "
                    "name, so give folders with different names",
                )
        folders.append(Folder(real, real.name))
    return folders


def folder_workspace(folders: list[Folder]) -> str:
    """owner-<folder name>-<hash of the full real paths>: the same folders, the same workspace,
    so tasks on them stack like tasks on any workspace."""
    digest = hashlib.sha256("\0".join(str(f.path) for f in folders).encode()).hexdigest()[:10]
    name = _UNSAFE.sub("_", folders[0].name).strip("._-")[:40] or "folder"
    more = f"-and-{len(folders) - 1}" if len(folders) > 1 else ""
    return f"owner-{name}{more}-{digest}"


def real_folders(paths: list[str]) -> list[Folder]:
    """The checked folders of a task, from what it recorded."""
    return [Folder(Path(p), Path(p).name) for p in paths]


def asker_only(uid: int | None, asker: int | None, task_id: str, what: str) -> None:
    """Refuses anyone but root and the account that asked for a personal task, whose folders
    its changes hold and go into. A task recorded before boxd kept its asker is root's alone."""
    if uid == 0:
        return
    if asker is None:
        die(
            Problem.FORBIDDEN,
            f"task {task_id} was asked for before boxd recorded which account asked: only root "
            f"may {what} it",
        )
    if uid != asker:
        name = user_name(asker)
        who = "root" if asker == 0 else f"{name} or root"
        die(Problem.FORBIDDEN, f"task {task_id} was asked for by {name}: only {who} may {what} it")
