"""The owner's changes to a workspace: an upload, a deletion, a rename, each an entry of the
workspace's stack of its own, never a write to the base under the tasks' mounted views.

An owner's change is a task record that is never started: worker "owner" (CreateTask refuses
it: only boxd makes these), done from the start, its title saying what it did, `saw` the stack
below it. Its layer (owner_layer.py) is made in a staging place outside any lock, then, under
the workspace's joins lock, renamed to the next layer's name and recorded with the task in one
transaction, as a done task's joins (ending.py): the next task's `saw` names it, DiffTask shows
it, UndoTask takes it out of the stack, history names it. A task running meanwhile keeps the
view it mounted: its lower layers do not change.
"""

import asyncio
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from boxd.errors import BoxError, Problem, die
from boxd.manager.record.ledger import TaskSave
from boxd.manager.record.records import Records
from boxd.manager.record.store import Store
from boxd.manager.units import at_rest
from boxd.manager.view_mounts import ViewMounts
from boxd.manager.workspaces import owner_layer
from boxd.manager.workspaces.diffs import Marks, shown_name
from boxd.manager.workspaces.layers import MAX_DONE, Layers, layer_name
from boxd.manager.workspaces.owner_layer import Made, Whiteout
from boxd.manager.workspaces.stack_view import Stack, stack_of
from boxd.manager.workspaces.tar_upload import add_tar
from boxd.manager.workspaces.workspaces import PERSONAL, Workspaces
from boxd.wire.caller import Caller, Role
from boxd.wire.event import EventKind
from boxd.wire.ids import new_task_id
from boxd.wire.models.task import OWNER_WORKER, Task, TaskState

log = logging.getLogger(__name__)


def _source(caller: Caller) -> str:
    """The door the change came by, as a task's source says it."""
    if caller.device is not None:
        return f"phone:{caller.device}"
    if caller.role == Role.SCREEN:
        return "screen"
    # The owner by polkit (boxctl, busctl) has a uid from the bus; a token has none.
    return "boxctl" if caller.uid is not None else "api"


def _shown(path: str) -> str:
    return shown_name(path)[0]


def _added_title(made: Made, folder: str) -> str:
    where = f" to {_shown(folder)}/" if folder else ""
    if made.files == 1 and made.folders == 0:
        return f"Added {_shown(made.added[0].rpartition('/')[2])}{where}"
    files = f"{made.files} file{'s' if made.files != 1 else ''}"
    if made.folders:
        files += f" in {made.folders} folder{'s' if made.folders != 1 else ''}"
    return f"Added {files}{where}"


class _Held:
    """A descriptor that exactly one of two threads takes, to read and close."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd
        self._lock = threading.Lock()

    def take(self) -> int | None:
        with self._lock:
            fd, self._fd = self._fd, None
            return fd


class OwnerChanges:
    def __init__(
        self,
        store: Store,
        records: Records,
        layers: Layers,
        workspaces: Workspaces,
        marks: Marks | None = None,
        whiteout: Whiteout = owner_layer.whiteout,
        views: ViewMounts | None = None,
    ) -> None:
        self.store = store
        self.records = records
        self.layers = layers
        self.workspaces = workspaces
        # overlayfs's marks; a unit test's own, which need no root.
        self.marks = marks or Marks()
        self.whiteout = whiteout
        # The owner's mounted views (view_mounts): a change's layer is opened to boxd-owner
        # before it joins, and the view remade once it has.
        self.views = views

    async def add_to_workspace(
        self, caller: Caller, name: str, path: str, fd: int
    ) -> dict[str, Any]:
        """Adds the tar stream read from `fd` (files and folders) under folder `path`."""
        self._check_workspace(name)
        # Our own copy: the server closes `fd` once this returns, and a thread still reading
        # (this call cancelled) must never read a number reused by then for another file. Its
        # one holder closes it: the thread that reads it, or this call if no thread took it.
        own = _Held(os.dup(fd))

        def work(made: Made, stack: Stack) -> tuple[str, dict[str, Any]]:
            source = own.take()
            if source is None:
                die(Problem.FAILED, "the upload was given up before it was read")
            try:
                add_tar(made, stack, path, source)
            finally:
                os.close(source)
            data = {
                "change": "added",
                "path": path,
                "files": made.files,
                "folders": made.folders,
                "bytes": made.bytes,
                "paths": made.added,
            }
            return _added_title(made, path), data

        try:
            return await self._change(caller, name, work, locked=False)
        finally:
            left = own.take()
            if left is not None:
                os.close(left)

    async def delete_from_workspace(self, caller: Caller, name: str, path: str) -> dict[str, Any]:
        self._check_workspace(name)

        def work(made: Made, stack: Stack) -> tuple[str, dict[str, Any]]:
            kind = owner_layer.delete_layer(made, stack, path, self.whiteout)
            return f"Deleted {_shown(path)}", {"change": "deleted", "path": path, "kind": kind}

        return await self._change(caller, name, work, locked=True)

    async def rename_in_workspace(
        self, caller: Caller, name: str, from_path: str, to_path: str
    ) -> dict[str, Any]:
        self._check_workspace(name)

        def work(made: Made, stack: Stack) -> tuple[str, dict[str, Any]]:
            kind = owner_layer.rename_layer(made, stack, from_path, to_path, self.whiteout)
            title = f"Renamed {_shown(from_path)} to {_shown(to_path)}"
            data = {"change": "renamed", "from": from_path, "to": to_path, "kind": kind}
            return title, data

        return await self._change(caller, name, work, locked=True)

    def _check_workspace(self, name: str) -> None:
        if not self.workspaces.exists(name):
            die(Problem.NOT_FOUND, f"no workspace {name}")
        if name.startswith(PERSONAL):
            die(
                Problem.INVALID,
                f"workspace {name} is the copy of your personal folders: change the folders "
                "themselves",
            )

    async def _stack(self, name: str) -> tuple[list[tuple[int, str]], Stack]:
        stack = await self.store.stack(name)
        if len(stack) >= MAX_DONE:
            die(
                Problem.INVALID,
                f"workspace {name} already holds {MAX_DONE} changes, the most it can stack: "
                "undo some of them first",
            )
        view = stack_of(self.layers, name, [layer_name(number) for number, _ in stack])
        return stack, Stack(view.levels, self.marks)

    async def _change(
        self,
        caller: Caller,
        name: str,
        work: Callable[[Made, Stack], tuple[str, dict[str, Any]]],
        locked: bool,
    ) -> dict[str, Any]:
        """Makes the change's layer with `work` and records it: a deletion or a rename is made
        under the joins lock, from the stack as it is; an upload, which may be long, before it
        (it reads the stack only to refuse a file where a folder is), so task starts and ends
        on the workspace do not wait for it."""
        store = self.layers.store(name)
        if locked:
            async with self.layers.joins[name]:
                stack, view = await self._stack(name)
                made, title, data = await self._made(store, view, work)
                await self._open_to_owner(name, made)
                task = await self._join(caller, name, made, title, data, stack)
        else:
            _, view = await self._stack(name)
            made, title, data = await self._made(store, view, work)
            await self._open_to_owner(name, made)
            async with self.layers.joins[name]:
                stack, _ = await self._stack(name)
                task = await self._join(caller, name, made, title, data, stack)
        if self.views is not None:
            await self.views.remake(name)
        return task

    async def _open_to_owner(self, name: str, made: Made) -> None:
        if self.views is not None:
            await self.views.open_layer(name, made.path)

    async def _made(
        self, store: Path, view: Stack, work: Callable[[Made, Stack], tuple[str, dict[str, Any]]]
    ) -> tuple[Made, str, dict[str, Any]]:
        def make() -> tuple[Made, str, dict[str, Any]]:
            try:
                made = owner_layer.stage(store, at_rest.work_gid())
            except OSError as error:
                if owner_layer.is_full(error):
                    owner_layer.refuse_full()
                raise
            try:
                title, data = work(made, view)
                owner_layer.synced(made)
            except BaseException as error:
                owner_layer.throw_away(made)
                if isinstance(error, OSError) and owner_layer.is_full(error):
                    owner_layer.refuse_full()
                raise
            return made, title, data

        return await asyncio.to_thread(make)

    async def _join(
        self,
        caller: Caller,
        name: str,
        made: Made,
        title: str,
        data: dict[str, Any],
        stack: list[tuple[int, str]],
    ) -> dict[str, Any]:
        """Under the joins lock: the staged layer renamed to the next layer's name, then
        recorded with its task; nothing recorded, and the layer gone, if either fails."""
        number = await self.store.next_layer(name)
        target = self.layers.store(name) / layer_name(number)
        task_id = new_task_id()
        task = Task(
            id=task_id,
            title=title,
            prompt=title,
            state=TaskState.DONE,
            user=caller.user or caller.name,
            workspace=name,
            worker=OWNER_WORKER,
            tools=[],
            hosts=[],
            source=_source(caller),
            budgetCents=0,
            saw=[done for _, done in stack],
            createdAt=time.time(),
            endedAt=time.time(),
        )

        def place() -> None:
            made.close()
            # A layer under this name that no record names was left by a join cut off before
            # its record (Layers.join says the same): it is no one's.
            if target.exists():
                shutil.rmtree(target)
            os.rename(made.path, target)
            fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        try:
            await asyncio.to_thread(place)
        except OSError as error:
            await asyncio.to_thread(owner_layer.throw_away, made)
            if owner_layer.is_full(error):
                owner_layer.refuse_full()
            raise
        saved = {"state": "done", "title": title, "by": caller.name, **data}
        try:
            await self.records.store.save_task(
                TaskSave(task, EventKind.TASK_STATE, saved, new=True, layer=number)
            )
        except Exception as error:
            # Not recorded, for sure: the transaction failed whole. (A request cancelled
            # mid-save may have been recorded: its layer stays, and if no record names it, the
            # next join of that number replaces it.)
            await self.layers.remove(name, layer_name(number))
            if isinstance(error, BoxError) and error.problem == Problem.FULL:
                owner_layer.refuse_full()
            if isinstance(error, OSError) and owner_layer.is_full(error):
                owner_layer.refuse_full()
            raise
        self.records.export(task)
        log.info("%s: %s in workspace %s (task %s)", caller.name, title, name, task_id)
        return task.public()
