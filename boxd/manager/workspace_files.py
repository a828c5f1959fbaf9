"""The workspace as it stands, read by its owner: a folder's entries in pages, a path's history,
and a plain file opened read-only, whose descriptor goes to the caller (boxd.dbus.fd_reply) and
never its bytes inside a D-Bus message.

The reading is boxd.manager.workspaces.stack_view's, in a thread, under the workspace's joins
lock: no layer leaves the stack (an undo, a removed workspace) while its folder is read. Once
begun, the thread is waited for with the lock still held even if the caller goes away, and what
it opened is then closed.

An app's or a member's token reads only the workspaces its limits name; any other is answered
exactly as a missing one, so a token cannot learn which names exist.
"""

import asyncio
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from boxd.dbus.fd_reply import Opened
from boxd.errors import Problem, die
from boxd.manager.folders.folders import caller_uid
from boxd.manager.workspaces import stack_view
from boxd.manager.workspaces.diffs import shown_name
from boxd.manager.workspaces.layers import Layers, layer_name
from boxd.manager.workspaces.stack_view import Entry, Stack
from boxd.manager.workspaces.workspaces import PERSONAL, SHARED, Workspaces
from boxd.reading.decimal_text import decimal
from boxd.wire.caller import Caller
from boxd.wire.models.token_limits import DEFAULT

T = TypeVar("T")

# Entries in one page of a listing: well under a D-Bus message, each entry's name being at most
# 255 bytes shown as up to 4 characters a byte.
PAGE_ENTRIES = 1000


def missing(name: str) -> str:
    return f"there is no workspace {shown_name(name)[0][:120]!r}"


async def readable(caller: Caller, name: str, workspaces: Workspaces) -> None:
    """The reading doors' rule (files, history, archives): a workspace the caller may not read
    is refused as missing, before it is looked up, so a token cannot probe names; a member's
    personal copy is root's alone to read."""
    if not caller.acts_as_owner:
        limits = caller.limits or DEFAULT
        if name not in limits.workspaces or name.startswith((PERSONAL, SHARED)):
            die(Problem.NOT_FOUND, missing(name))
    if not workspaces.exists(name):
        die(Problem.NOT_FOUND, missing(name))
    await root_alone_reads_personal(caller, name)


async def root_alone_reads_personal(caller: Caller, name: str) -> None:
    """Refuses the copy of a member's personal folders to all but root: several members of
    boxd-owner share one box, and none reads another's files through root (the owner's view
    leaves these copies out, and only the account that asked, or root, reviews such a task).
    The account that asked reads its own folders themselves, and a task's changes by its
    review (boxctl diff)."""
    if not name.startswith(PERSONAL):
        return
    if await asyncio.to_thread(caller_uid, caller) != 0:
        die(
            Problem.FORBIDDEN,
            f"workspace {shown_name(name)[0][:120]!r} is a copy of a member's personal folders: "
            "only root reads it here; read your folders themselves, and a task's changes with "
            "boxctl diff ID",
        )


def modified(mtime: float) -> str:
    return datetime.fromtimestamp(mtime, UTC).isoformat().replace("+00:00", "Z")


async def whole_thread(work: Callable[[], T], undo: Callable[[T], None]) -> T:
    """work() in a thread, waited for to its end even if the caller is cancelled meanwhile (so
    what holds a lock around this still holds it while the thread runs); cancelled, what the
    thread made is undone and the cancellation goes on."""
    running = asyncio.ensure_future(asyncio.to_thread(work))
    cancelled = False
    while not running.done():
        try:
            await asyncio.wait({running})
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if running.exception() is None:
            undo(running.result())
        raise asyncio.CancelledError
    return running.result()


class Stacks(Protocol):
    """Where the stack of each workspace is recorded (boxd.manager.record.store.Store)."""

    async def stack(self, workspace: str) -> list[tuple[int, str]]: ...


def _keep(_: object) -> None:
    """Nothing to undo: what the thread made is only read."""


class WorkspaceFiles:
    def __init__(self, store: Stacks, layers: Layers, workspaces: Workspaces) -> None:
        self.store = store
        self.layers = layers
        self.workspaces = workspaces

    async def _read(
        self, name: str, work: Callable[[Stack, dict[str, str]], T], undo: Callable[[T], None]
    ) -> T:
        """work(stack, task of each layer) in a thread, under the workspace's joins lock."""
        async with self.layers.joins[name]:
            if not self.workspaces.exists(name):  # removed while the lock was awaited
                die(Problem.NOT_FOUND, missing(name))
            layers = await self.store.stack(name)
            tasks = {layer_name(number): task for number, task in layers}
            stack = stack_view.stack_of(self.layers, name, list(tasks))
            return await whole_thread(lambda: work(stack, tasks), undo)

    async def list_workspace_files(
        self, caller: Caller, name: str, path: str, page: str
    ) -> dict[str, Any]:
        await readable(caller, name, self.workspaces)
        stack_view.checked(path)
        start = _start(page)

        def read(stack: Stack, tasks: dict[str, str]) -> dict[str, Any]:
            listing = stack_view.list_folder(stack, path)
            shown = listing.entries[start : start + PAGE_ENTRIES]
            entries = [_entry(stack, tasks, path, entry) for entry in shown]
            answer: dict[str, Any] = {
                "workspace": name,
                "path": path,
                "entries": entries,
                "truncated": listing.truncated,
                "next": None,
            }
            if start + PAGE_ENTRIES < len(listing.entries):
                answer["next"] = str(start + PAGE_ENTRIES)
            return answer

        return await self._read(name, read, _keep)

    async def get_workspace_file_history(
        self, caller: Caller, name: str, path: str
    ) -> dict[str, Any]:
        await readable(caller, name, self.workspaces)
        stack_view.checked(path)

        def read(stack: Stack, tasks: dict[str, str]) -> dict[str, Any]:
            said = stack_view.changes(stack, path)
            return {
                "workspace": name,
                "path": path,
                "tasks": [
                    {
                        "task": tasks[layer],
                        "change": change,
                        "diff": f"/api/tasks/{tasks[layer]}/diff",
                    }
                    for layer, change in said
                    if layer is not None
                ],
                "inBase": any(layer is None for layer, _ in said),
            }

        return await self._read(name, read, _keep)

    async def open_workspace_file(self, caller: Caller, name: str, path: str) -> Opened:
        await readable(caller, name, self.workspaces)
        stack_view.checked(path)

        def read(stack: Stack, tasks: dict[str, str]) -> Opened:
            fd, entry = stack_view.open_file(stack, path)
            answer = {
                "workspace": name,
                "path": path,
                "size": entry.size,
                "modified": modified(entry.mtime),
                "task": None if entry.layer is None else tasks.get(entry.layer),
            }
            return Opened(answer, fd)

        return await self._read(name, read, lambda opened: os.close(opened.fd))


def _start(page: str) -> int:
    if page == "":
        return 0
    start = decimal(page, most_digits=9)
    if start is None:
        die(
            Problem.INVALID, f"page {page[:40]!r} is not one this box handed out: send '' or a next"
        )
    return start


def _entry(stack: Stack, tasks: dict[str, str], folder: str, entry: Entry) -> dict[str, Any]:
    found: dict[str, Any] = {
        "name": entry.name,
        "kind": entry.kind.value,
        "size": entry.size,
        "modified": modified(entry.mtime),
        "task": None if entry.layer is None else tasks.get(entry.layer),
    }
    if entry.not_utf8:
        found["nameNotUtf8"] = True
    elif entry.kind.value == "link":
        path = f"{folder}/{entry.name}" if folder else entry.name
        found["target"] = stack_view.link_target(stack, entry.layer, path)
    return found
