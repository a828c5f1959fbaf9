"""Workspace layers: each task works on an overlay of its workspace as it stood when it started.

A workspace's stack is its base (`BOX_HOME/workspaces/<name>`, the owner's files) plus one layer
per done task (`BOX_HOME/layers/<name>/<n>`, newest on top). A task's view is overlayfs with its
own upper directory over that stack, mounted on the worker's working directory. Done: the upper
directory joins the stack. Failed: it is thrown away. Undone: the layer leaves the stack; files
that later tasks changed are full copies in their own layers, so they keep theirs.

The kernel stacks at most 500 lower layers: the base and 499 done tasks. The mount options are
one page long at most on kernels before 6.8, so layers have short names (base 36 numbers) and
are mounted from inside the layer store by relative name, with mount(2) (`mount_overlay`).
"""

import asyncio
import os
import shutil
import stat
from pathlib import Path

from boxd.errors import Problem, die
from boxd.manager.keyed_locks import KeyedLocks
from boxd.manager.run import complaint
from boxd.manager.units import at_rest, disk_quota
from boxd.paths import task_dir, task_work_dir, workspaces_dir

MAX_DONE = 499
# util-linux 2.39 and later (Debian 13 has 2.41) mount through the kernel's new mount API, whose
# fsconfig() takes an option's value of 255 bytes at most: the lowerdir of a stack of about 90
# layers or more is refused ("wrong fs type, bad option"). mount(2) takes a page of options,
# which the names of 500 lower layers fit in. Older util-linux has only mount(2) and ignores it.
CLASSIC_MOUNT = {"LIBMOUNT_FORCE_MOUNT2": "always"}
# Why a task whose changes were thrown away as it ended (Layers.throw_away) does not resume.
THROWN_AWAY = (
    "its changes were thrown away to free the full disk as it ended, before boxd could record "
    "its end"
)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
# Where an owner's change makes its layer before it is renamed to its layer's name and recorded
# (boxd.manager.workspaces.owner_layer): a folder of a layer store whose name starts so.
STAGING = ".staging-"


async def mount_overlay(source: str, options: str, target: Path, store: Path) -> str | None:
    """Mounts an overlay whose lower folders `options` names relative to the layer store;
    None when mounted, else why not."""
    return await complaint(
        "mount", "-t", "overlay", source, "-o", options, str(target), cwd=store, env=CLASSIC_MOUNT
    )


def layer_name(number: int) -> str:
    name = ""
    while True:
        number, digit = divmod(number, 36)
        name = _DIGITS[digit] + name
        if number == 0:
            return name


def overlay_options(lowers: list[str], upper: Path, work: Path) -> str:
    """A task's view's mount options: `lowers` newest first, relative to the layer store, where
    the mount runs (the module says why)."""
    # No redirects or metadata-only copies: a layer holds whole files and whole folders,
    # so it can leave the stack, or be applied to the owner's real folders, on its own.
    # nosuid, as systemd binds the view into a worker it starts (NoNewPrivileges=): a spare's
    # worker, started before the view, sees this mount itself, and sees it the same.
    return (
        f"nosuid,lowerdir={':'.join(lowers)},upperdir={upper},"
        f"workdir={work},redirect_dir=off,metacopy=off"
    )


def _sync_dir(path: Path) -> None:
    fd = os.open(path, _DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Layers:
    def __init__(self, home: Path) -> None:
        self.home = home
        # One lock per workspace: its mirror, its stack and the mounts made from it change
        # under it, so no layer is taken away while a task is mounting it.
        self.joins = KeyedLocks()

    def open(self) -> None:
        """The layer store: only root reads it, and overlay mounts, which read as root."""
        root = self.home / "layers"
        root.mkdir(mode=at_rest.LAYERS, exist_ok=True)
        at_rest.restrict(root, at_rest.LAYERS)
        # An owner's change cut off before it was recorded left its staged layer: no one's.
        for staged in root.glob(f"*/{STAGING}*"):
            shutil.rmtree(staged, ignore_errors=True)

    def store(self, workspace: str) -> Path:
        return self.home / "layers" / workspace

    def upper(self, task_id: str) -> Path:
        """Where a running task's changes are written."""
        return self._upper(task_id)

    def _upper(self, task_id: str) -> Path:
        return task_dir(self.home, task_id) / "upper"

    def _scratch(self, task_id: str) -> Path:
        return task_dir(self.home, task_id) / "overlay-work"

    def mount_point(self, task_id: str) -> None:
        """Makes the view's mount point for a spare's worker, which starts in it before its task
        exists and so before its view is mounted (boxd/workers/ahead.py): a task's user may pass
        through it. One already there is left as it is: it may be a view mounted."""
        view = task_work_dir(self.home, task_id)
        try:
            view.mkdir(mode=at_rest.MOUNT_POINT)
        except FileExistsError:
            return
        at_rest.restrict(view, at_rest.MOUNT_POINT)

    async def mount(
        self, task_id: str, workspace: str, stack: list[str], uid: int, project: bool = False
    ) -> None:
        """Mounts the task's view: its upper directory over `stack` (layer names, newest first)
        over the base. Mounting again after a restart keeps what the task already wrote; a task
        whose changes were thrown away as it ended (throw_away) is not mounted again. With
        `project`, what the task writes counts against its disk quota
        (boxd.manager.units.disk_quota): the upper and the overlay's work folder, where overlayfs
        makes each file first."""
        view = task_work_dir(self.home, task_id)
        if await asyncio.to_thread(os.path.ismount, view):
            return
        if await asyncio.to_thread(self._thrown_away(task_id).exists):
            die(Problem.FAILED, THROWN_AWAY)
        store = self.store(workspace)
        store.mkdir(parents=True, exist_ok=True)
        upper = self._upper(task_id)
        upper.mkdir(mode=0o700, exist_ok=True)
        os.chown(upper, uid, -1)
        self._scratch(task_id).mkdir(mode=0o700, exist_ok=True)
        if project:
            for made in (upper, self._scratch(task_id)):
                await asyncio.to_thread(disk_quota.set_project_of, made.parent, made.name, uid)
        view.mkdir(mode=0o700, exist_ok=True)
        # BOX_HOME/workspaces/<name>, seen from BOX_HOME/layers/<name>.
        base = f"../../{workspaces_dir(self.home).name}/{workspace}"
        options = overlay_options([*stack, base], upper, self._scratch(task_id))
        failed = await mount_overlay("overlay", options, view, store)
        if failed:
            die(
                Problem.FAILED,
                f"could not mount the task's copy of workspace {workspace}: {failed}",
            )

    async def unmount(self, task_id: str) -> None:
        view = task_work_dir(self.home, task_id)
        if await asyncio.to_thread(os.path.ismount, view):
            # Lazy: a process the worker left behind must not keep the layer from joining.
            failed = await complaint("umount", "--lazy", str(view))
            if failed:
                die(Problem.FAILED, f"could not unmount {view}: {failed}")

    def _joining(self, task_id: str) -> Path:
        """Says, until the end is recorded, which layer the task's upper directory moved to."""
        return task_dir(self.home, task_id) / "joining"

    async def join(self, task_id: str, workspace: str, name: str) -> None:
        """Puts the done task's upper directory on top of the stack, under `name`. Call
        `joined` once the end is recorded; until then `take_back` can undo it."""
        target = self.store(workspace) / name

        def move() -> None:
            # A layer that no record names: a join cut off before its record, whose task took
            # it back when it resumed (take_back) or ended failed. It is no one's.
            if target.exists():
                shutil.rmtree(target)
            with self._joining(task_id).open("w") as note:
                note.write(name)
                note.flush()
                os.fsync(note.fileno())
            self._upper(task_id).rename(target)
            shutil.rmtree(self._scratch(task_id), ignore_errors=True)
            fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        await asyncio.to_thread(move)

    async def joined(self, task_id: str) -> None:
        await asyncio.to_thread(self._joining(task_id).unlink, True)

    async def take_back(self, task_id: str, workspace: str) -> bool:
        """A join cut off before the task's end was recorded (the manager killed, the power
        cut): the layer it made is the task's upper directory again, so the task resumes with
        what it wrote instead of an empty one whose join would then replace it."""

        def move() -> bool:
            joining = self._joining(task_id)
            try:
                name = joining.read_text().strip()
            except FileNotFoundError:
                return False
            target = self.store(workspace) / name
            upper = self._upper(task_id)
            if name and target.is_dir() and not upper.exists():
                target.rename(upper)
                moved = True
            else:
                moved = False
            joining.unlink()
            return moved

        return await asyncio.to_thread(move)

    def _thrown_away(self, task_id: str) -> Path:
        """A failed task's upper directory, emptied before its end was recorded (throw_away)."""
        return task_dir(self.home, task_id) / "thrown-away"

    async def throw_away(self, task_id: str) -> None:
        """Deletes the changes of a task that failed before its end is recorded: on a full disk
        the record needs their space, which may be the space it waits for. The upper directory
        is renamed first, which takes no space, and left empty under its new name: a manager cut
        off before the record finds it so, and the task fails rather than resume as if the
        changes its log says it made were there (mount refuses)."""

        def empty() -> None:
            try:
                self._upper(task_id).rename(self._thrown_away(task_id))
            except FileNotFoundError:
                pass
            else:
                _sync_dir(task_dir(self.home, task_id))
            try:
                fd = os.open(self._thrown_away(task_id), _DIR_FLAGS)
            except FileNotFoundError:
                return
            try:
                for name in os.listdir(fd):
                    # rmtree works from directory fds: it follows no link the task left.
                    if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                        shutil.rmtree(name, dir_fd=fd)
                    else:
                        os.unlink(name, dir_fd=fd)
            finally:
                os.close(fd)

        await asyncio.to_thread(empty)

    async def discard(self, task_id: str) -> None:
        def remove() -> None:
            shutil.rmtree(self._upper(task_id), ignore_errors=True)
            shutil.rmtree(self._scratch(task_id), ignore_errors=True)
            shutil.rmtree(self._thrown_away(task_id), ignore_errors=True)

        await asyncio.to_thread(remove)

    async def remove(self, workspace: str, name: str) -> None:
        await asyncio.to_thread(shutil.rmtree, self.store(workspace) / name, True)
