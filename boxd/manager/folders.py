"""Personal folders: real folders of the owner that a task works on a copy of.

A folder must be in the owner's home or in Settings agentFolders, must not belong to root, and
can never be the system or the box's own state. Links are followed to where they really go, and
the rules apply there: a link in the owner's home that points into BOX_HOME is the box's state.
"""

import hashlib
import pwd
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from boxd.errors import Problem, die

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
        "/opt/boxd",
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


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _refuse(asked: str, why: str) -> NoReturn:
    die(Problem.INVALID, f"folder {asked}: {why}")


def check_folder(asked: str, home: Path | None, agent_folders: list[str], box_home: Path) -> Path:
    """Returns the folder's real path, or refuses it in words the owner can act on."""
    try:
        real = Path(asked).resolve(strict=True)
    except FileNotFoundError:
        _refuse(asked, "there is no such folder")
    except (OSError, RuntimeError) as error:
        _refuse(asked, f"it cannot be followed to a real folder ({error})")
    where = "" if str(real) == asked.rstrip("/") else f" (a link to {real})"
    if not real.is_dir():
        _refuse(asked, f"it is not a folder{where}")
    box_state = box_home.resolve()
    if _inside(real, box_state) or _inside(box_state, real):
        _refuse(asked, f"it holds the box's own state{where}; agents never work on that")
    for system in SYSTEM:
        if real == Path("/") or _inside(real, system):
            _refuse(asked, f"it is part of the system{where}; agents never work on that")
    allowed = [Path(f).resolve() for f in agent_folders]
    in_home = home is not None and real != home.resolve() and _inside(real, home.resolve())
    if not in_home and not any(_inside(real, folder) for folder in allowed):
        yours = f"your home folder ({home})" if home is not None else "your home folder"
        _refuse(asked, f"it is not in {yours} or in Settings agentFolders{where}")
    if real.stat().st_uid == 0:
        _refuse(asked, f"it belongs to root{where}; agents may not use root's folders")
    return real


def check_folders(
    asked: list[str], home: Path | None, agent_folders: list[str], box_home: Path
) -> list[Folder]:
    """Checks every folder; they must be distinct, not inside each other, and named apart, since
    they show up side by side, each under its real folder's name."""
    folders: list[Folder] = []
    for path in asked:
        real = check_folder(path, home, agent_folders, box_home)
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


def owner_home(user: str | None) -> Path | None:
    """The home folder of the account the owner called as, if it has one."""
    if user is None:
        return None
    try:
        return Path(pwd.getpwnam(user).pw_dir)
    except KeyError:
        return None


def real_folders(paths: list[str]) -> list[Folder]:
    """The checked folders of a task, from what it recorded."""
    return [Folder(Path(p), Path(p).name) for p in paths]
