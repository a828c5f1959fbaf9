"""Workspaces: folders in BOX_HOME/workspaces that tasks work on copies of.

`home` exists from the start and stays. Removing a workspace never deletes files: the folder
moves to BOX_HOME/trash, where the owner can take anything back.
"""

import asyncio
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from boxd.errors import Problem, die
from boxd.manager.units import at_rest
from boxd.paths import workspaces_dir

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
HOME = "home"
# Names the box gives: copies of the owner's folders, and files shared to one task.
PERSONAL = "owner-"
SHARED = "files-"


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        die(
            Problem.INVALID,
            f"{name!r} is not a workspace name: use up to 100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
        )
    return name


class Workspaces:
    def __init__(self, home: Path) -> None:
        self._root = workspaces_dir(home)
        self._trash = home / "trash"

    def open(self) -> None:
        self._root.mkdir(parents=True, exist_ok=True)
        # The gate: bases made before it was closed, world-readable, are behind it too.
        at_rest.restrict(self._root, at_rest.WORKSPACES, at_rest.work_gid())
        if not (self._root / HOME).is_dir():
            self._make(self._root / HOME)

    @staticmethod
    def _make(folder: Path) -> None:
        """A workspace folder belongs to group boxd-work, setgid, so what is put in it can be
        changed by the tasks (their workers run with that group), and no one else may look."""
        folder.mkdir(mode=0o700)
        at_rest.restrict(folder, at_rest.WORKSPACE, at_rest.work_gid())

    def exists(self, name: str) -> bool:
        return NAME.fullmatch(name) is not None and (self._root / name).is_dir()

    def names(self) -> list[str]:
        return sorted(p.name for p in self._root.iterdir() if p.is_dir() and NAME.fullmatch(p.name))

    def describe(self, name: str) -> dict[str, Any]:
        return {"name": name, "path": str(self._root / name)}

    async def create(self, name: str, *, files: bool = False) -> dict[str, Any]:
        check_name(name)
        if name.startswith(PERSONAL):
            die(
                Problem.INVALID,
                f"{name!r}: names that start with {PERSONAL} are kept for the copies of the "
                "owner's personal folders",
            )
        if name.startswith(SHARED) and not files:
            die(
                Problem.INVALID,
                f"{name!r}: names that start with {SHARED} are kept for files shared to a task",
            )
        try:
            self._make(self._root / name)
        except FileExistsError:
            die(Problem.INVALID, f"workspace {name} already exists")
        return self.describe(name)

    async def put(self, name: str, files: dict[str, bytes]) -> None:
        """Writes files into a workspace's base, group-writable for the tasks, closed to others."""
        folder = self._root / name

        def write() -> None:
            for file_name, content in files.items():
                path = folder / file_name
                with path.open("wb") as handle:
                    handle.write(content)
                    handle.flush()
                    os.fchmod(handle.fileno(), at_rest.WORKSPACE_FILE)
                    os.fsync(handle.fileno())

        await asyncio.to_thread(write)

    async def remove_unrecorded(self, name: str) -> None:
        """Removes a workspace made for a task that was then never recorded."""
        await asyncio.to_thread(shutil.rmtree, self._root / check_name(name), ignore_errors=True)

    def check_removable(self, name: str, busy: list[str]) -> None:
        """`busy` are the unfinished tasks working on the workspace."""
        if not self.exists(check_name(name)):
            die(Problem.NOT_FOUND, f"no workspace {name}")
        if name == HOME:
            die(Problem.INVALID, "home is the box's default workspace; it cannot be removed")
        if busy:
            die(
                Problem.INVALID,
                f"workspace {name} has unfinished tasks ({', '.join(busy)}); stop them first",
            )

    async def move_to_trash(self, name: str, layers: Path) -> dict[str, Any]:
        """Moves the base folder, and the layers of the tasks done on it, to the trash."""
        self._trash.mkdir(mode=0o700, exist_ok=True)
        target = self._trash / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"

        def move() -> None:
            target.mkdir(mode=0o700)
            shutil.move(self._root / name, target / "base")
            if layers.is_dir():
                shutil.move(layers, target / "layers")

        await asyncio.to_thread(move)
        return {"name": name, "trash": str(target / "base")}
