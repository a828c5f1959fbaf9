"""Task ids made ahead: a few ids, each with its user and its network namespace already made, so
a task that takes one starts without waiting for groupadd, useradd and ip (docs/performance.md,
"What a start saves ahead").

A spare weakens none of what a task's user promises (users.py): its uid is claimed from the
store like any task's, never handed out before and never again. Until a task takes it, what runs
as it is boxd's own worker started ahead (boxd/workers/ahead.py), which writes nothing, and what
it owns is its empty home, made as a task's is: it is new and holds nothing of anyone's. Its
broker and worker started ahead take Python, imports and sandbox off the start of the task
that takes it. A spare left when boxd stops has no task and never will: the next
manager removes its units, user and namespace (`leftovers`) rather than trust what it finds.
Spares are made one at a time, as boxd starts and after a task took one, beside that task's own
start.
"""

import asyncio
import contextlib
import grp
import logging
import pwd
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import partial

from dbus_fast import Variant

from boxd.errors import Problem, die
from boxd.manager.access.vault import Vault
from boxd.manager.at_once import at_once
from boxd.manager.machinery import Machinery, OnMachinery
from boxd.manager.units import at_rest
from boxd.manager.units.systemd import SystemdError
from boxd.manager.units.users import FIRST_UID, LAST_UID, id_taken
from boxd.manager.units.worker_unit import (
    ahead_worker_properties,
    broker_units,
    task_slice,
    worker_unit,
)
from boxd.paths import task_dir, task_work_dir
from boxd.wire.ids import is_task_id, new_task_id, task_user
from boxd.wire.models.settings import Settings
from boxd.wire.models.task import Task
from boxd.wire.worker_kinds import WAKES

log = logging.getLogger(__name__)

# How many ids are kept ready: tasks started together beyond this make their users as they
# start, as every task did before.
SPARES = 2
# How long a spare waits for its worker started ahead to be ready (its imports, a fraction of a
# second at rest, seconds under load), and how often it looks.
AHEAD_READY_SECONDS = 30.0
AHEAD_POLL_SECONDS = 0.02


class Spares:
    def __init__(
        self,
        make: Callable[[str], Awaitable[None]],
        drop: Callable[[str], Awaitable[None]],
        count: int = SPARES,
    ) -> None:
        self._make = make
        self._drop = drop
        self._count = count
        self._ready: list[str] = []
        self._filling: asyncio.Task[None] | None = None

    def take(self) -> str | None:
        """A ready id, whose user and namespace are made, or None. Call `fill_soon` once the
        task that took it has started, so that making the next does not slow that start."""
        return self._ready.pop(0) if self._ready else None

    def ready(self) -> list[str]:
        return list(self._ready)

    def discard(self, task_id: str) -> bool:
        """Takes a ready id out of the spares, to be dropped and made again (its worker ended,
        say); False if it is not ready, taken by a task or never made."""
        if task_id not in self._ready:
            return False
        self._ready.remove(task_id)
        return True

    def give_back(self, task_id: str) -> None:
        """An id taken for a task that was not recorded after all: still no one's."""
        self._ready.insert(0, task_id)

    def fill_soon(self) -> None:
        if self._filling is None or self._filling.done():
            self._filling = asyncio.create_task(self._fill())

    async def filled(self) -> None:
        """Returns once the making under way, if any, is over."""
        if self._filling is not None:
            await asyncio.shield(self._filling)

    async def _fill(self) -> None:
        while len(self._ready) < self._count:
            task_id = new_task_id()
            try:
                await self._make(task_id)
            except Exception as error:
                # Tasks still start without spares; the next take tries again.
                log.warning("could not make a spare task id ready: %s", _words(error))
                await self._drop_quietly(task_id)
                return
            self._ready.append(task_id)

    async def _drop_quietly(self, task_id: str) -> None:
        try:
            await self._drop(task_id)
        except Exception as error:
            log.warning("could not remove spare %s: %s", task_id, _words(error))

    async def drop_leftovers(self, task_ids: Iterable[str]) -> None:
        for task_id in task_ids:
            await self._drop_quietly(task_id)


@dataclass(frozen=True)
class Ahead:
    """What a spare's broker and worker, started ahead of its task, were started with: the vault
    as of its count of changes (Vault.changes), their units as of systemd's count of reloads, and
    the worker's unit's properties."""

    vault_changes: int
    reloads: int
    worker: list[tuple[str, Variant]]

    def broker_holds(self, vault_changes: int, reloads: int) -> bool:
        """Whether the broker started ahead holds the secrets and the unit of now."""
        return (self.vault_changes, self.reloads) == (vault_changes, reloads)

    def worker_holds(self, reloads: int, worker: list[tuple[str, Variant]]) -> bool:
        """Whether the worker started ahead runs in the unit it would be started in now: the
        settings' limits are in its properties, a drop-in's changes in systemd's reloads."""
        return self.reloads == reloads and self.worker == worker


class SpareMaker(OnMachinery):
    """Makes and drops the spares (Spares), each with its user, network namespace, home, and
    broker and worker started ahead; makes again those whose worker ended or whose units are
    no longer the ones a task would get; and hands a task that took one what was made ahead."""

    def __init__(self, machinery: Machinery, vault: Vault) -> None:
        super().__init__(machinery)
        self.vault = vault
        self.pool = Spares(self.make, self.drop)
        # A reload (a drop-in, a package's units) leaves the spares' brokers and workers with
        # their units as they were: made again now, not as the next tasks take them.
        self.systemd.reloaded = self._after_reload
        # The tasks recorded as the manager opened: their users are no spare's leftovers.
        self.known_at_open: set[str] = set()
        # Tasks whose id was a spare, until their start: their user and namespace are made.
        self._made_ahead: set[str] = set()
        # Spares' brokers and workers started ahead, by id, until their task's units start: what
        # each was started with (Ahead).
        self._ahead: dict[str, Ahead] = {}
        self.ready_seconds = AHEAD_READY_SECONDS
        self.poll_seconds = AHEAD_POLL_SECONDS

    def taken(self, task_id: str) -> None:
        """A task was recorded with a spare's id: its user and namespace are made."""
        self._made_ahead.add(task_id)

    def made_ahead(self, task_id: str) -> bool:
        """Whether the task's user and namespace were made ahead, in this run; asked once, as
        its view is made."""
        made = task_id in self._made_ahead
        self._made_ahead.discard(task_id)
        return made

    def take_ahead(self, task_id: str) -> "Ahead | None":
        """What the task's broker and worker started ahead were started with, if it took a
        spare that has them; once, as its units start."""
        return self._ahead.pop(task_id, None)

    def forget(self, task_id: str) -> None:
        """The task ended: what was started ahead for it is gone with its units."""
        self._ahead.pop(task_id, None)

    async def renew_leftovers(self) -> None:
        """Removes the spares an earlier manager left (the module says why), then makes new."""

        def accounts() -> list[tuple[str, int]]:
            users = [(user.pw_name, user.pw_uid) for user in pwd.getpwall()]
            return users + [(group.gr_name, group.gr_gid) for group in grp.getgrall()]

        found = leftovers(
            await asyncio.to_thread(accounts),
            await asyncio.to_thread(self.task_os.netns_ids),
            self.known_at_open,
        )
        for task_id in found:
            if await self.store.task(task_id) is None:
                log.info("removing spare task user %s, left by an earlier run", task_user(task_id))
                await self.pool.drop_leftovers([task_id])
        self.pool.fill_soon()

    async def make(self, task_id: str) -> None:
        # A spare's worker runs in a task's sandbox: none while the machine cannot make one.
        # Its words go to the journal alone.
        await self.doctor.refuse_if_failing(to_owner=True)
        uid = await self.store.claim_uid(task_id, FIRST_UID, LAST_UID, id_taken)
        directory = at_rest.task_directory(self.home, task_id)
        await at_once(
            self.task_os.ensure_user(task_user(task_id), directory, uid),
            self.task_os.ensure_netns(task_id),
        )
        # Its broker and sockets too, so the task's first request does not wait for the broker's
        # start-up (its sandbox, its imports, the bus). It serves nothing until its
        # task's worker connects (boxd/broker/main.py); its sockets are the spare's user's and in
        # its namespace. The vault's count is read first: a change made after that is seen.
        worker = ahead_worker_properties(self.home, task_id, await self.store.settings())
        self._ahead[task_id] = Ahead(self.vault.changes, self.systemd.reloads, worker)
        for unit in broker_units(task_id):
            await self.systemd.start_unit(unit)
        # And its worker, which imports its code and waits, as the spare's user and in the
        # worker's sandbox, in the empty mount point of its view, until its task's view is
        # mounted there and it is told which worker to be (boxd/workers/ahead.py).
        await self.task_os.prepare_home(self.home, task_id, uid)
        await asyncio.to_thread(self.layers.mount_point, task_id)
        # Watched from before its start: one that ends while it waits (killed, its memory
        # short) is no spare, and is made again rather than found so by the task that takes it.
        self.systemd.watch(worker_unit(task_id), partial(self._spare_worker_changed, task_id))
        await self.systemd.start_transient(worker_unit(task_id), worker)
        await self._until_waiting(worker_unit(task_id))

    def _spare_worker_changed(self, task_id: str) -> None:
        self.background(self._renew_if_ended(task_id))

    async def _renew_if_ended(self, task_id: str) -> None:
        status = await self.systemd.status(worker_unit(task_id))
        if status is None or status.finished:
            await self._renew(task_id, "its worker ended")

    def _after_reload(self) -> None:
        self.background(self.renew_stale())

    async def renew_stale(self, settings: Settings | None = None) -> None:
        """Makes again the spares whose worker's unit is not the one a task would get now, with
        `settings` or the box's."""
        if settings is None:
            settings = await self.store.settings()
        await self._renew_ready_stale(settings)
        # A spare being made as they changed was begun with the settings and units of before and
        # is not ready yet: looked at again once the making under way is over.
        await self.pool.filled()
        await self._renew_ready_stale(settings)

    async def _renew_ready_stale(self, settings: Settings) -> None:
        for task_id in self.pool.ready():
            ahead = self._ahead.get(task_id)
            now = ahead_worker_properties(self.home, task_id, settings)
            if ahead is not None and not ahead.worker_holds(self.systemd.reloads, now):
                await self._renew(
                    task_id, "the box's settings or systemd's units changed since it was made"
                )

    async def _renew(self, task_id: str, why: str) -> None:
        """Drops a ready spare and makes another; one a task took meanwhile is the task's."""
        if not self.pool.discard(task_id):
            return
        log.info("making spare %s again: %s", task_id, why)
        try:
            await self.drop(task_id)
        except Exception as error:
            log.warning("could not remove spare %s: %s", task_id, _words(error))
        self.pool.fill_soon()

    async def _until_waiting(self, unit: str) -> None:
        """Returns once the spare's worker catches its wake-up signals, its imports done, or
        after AHEAD_READY_SECONDS all the same: a task that takes it before would find it not
        ready and start a new worker, so until then the spare is not handed out. Fails if the
        worker ends first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_seconds
        while loop.time() < deadline:
            pid = await self.systemd.main_pid(unit)
            if pid is None:
                # Not forked yet, or ended already (its imports failed, it was killed): one that
                # ended is no spare, and the making stops here, as on any failure (spares.py).
                status = await self.systemd.status(unit)
                if status is None or status.finished:
                    die(Problem.FAILED, f"the worker started ahead as {unit} ended as it started")
            elif await asyncio.to_thread(self.task_os.catches, pid, WAKES):
                return
            await asyncio.sleep(self.poll_seconds)
        log.warning("the worker started ahead as %s did not get ready in time", unit)

    async def why_not_woken(self, task: Task, ahead: Ahead, settings: Settings) -> str | None:
        """Why the spare's worker started ahead cannot be this task's, or None: its unit must be
        the one the task would get now, and its process there, catching its signal and seeing
        the task's view (worker_ahead.py)."""
        if not ahead.worker_holds(
            self.systemd.reloads, ahead_worker_properties(self.home, task.id, settings)
        ):
            return "the box's settings or systemd's units changed since it started"
        try:
            pid = await self.systemd.main_pid(worker_unit(task.id))
        except SystemdError as failure:
            return str(failure)
        if pid is None:
            return "its process is gone"
        return await asyncio.to_thread(
            self.task_os.not_ready, pid, task_work_dir(self.home, task.id), WAKES
        )

    async def drop(self, task_id: str) -> None:
        """Its worker's and broker's units go first, and a failure to stop them keeps its user:
        the next manager finds it and tries again, so no unit outlives the user it runs as or
        its sockets belong to."""
        self._ahead.pop(task_id, None)
        self.systemd.unwatch(worker_unit(task_id))
        for unit in (
            worker_unit(task_id),
            task_slice(task_id),
            *reversed(broker_units(task_id)),
        ):
            await self.systemd.stop_unit(unit)
            await self.systemd.reset_failed(unit)
        # Its home, its view's mount point and its directory, made with it, before its user and
        # namespace, which a manager cut off in between leaves for the next to find (leftovers)
        # and drop again. Nothing of a task was ever in them; what is not empty (or not a
        # directory, or mounted) is left as it is.
        await self.task_os.remove_home(self.home, task_id)
        for empty in (task_work_dir(self.home, task_id), task_dir(self.home, task_id)):
            with contextlib.suppress(OSError):
                empty.rmdir()
        await self.task_os.remove_task_user(task_id)
        await self.task_os.remove_netns(task_id)


def leftovers(
    accounts: Iterable[tuple[str, int]], namespaces: Iterable[str], tasks: set[str]
) -> list[str]:
    """The ids of spares an earlier manager made, or began to make, and no task took: task
    users and groups (box-<id>, with an id of boxd's) and task namespaces whose id has no task."""
    found = {
        name.removeprefix("box-")
        for name, number in accounts
        if name.startswith("box-") and FIRST_UID <= number <= LAST_UID
    }
    found.update(namespaces)
    return sorted(task_id for task_id in found if is_task_id(task_id) and task_id not in tasks)


def _words(error: Exception) -> str:
    message = getattr(error, "message", None)
    return message if isinstance(message, str) else str(error) or type(error).__name__
