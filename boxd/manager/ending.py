"""The end of a task's life: its worker's unit followed until it finishes, the task ended
(done, failed, stopped) and its end recorded, then what it leaves cleared up, partly in a job of
its own; and the full disk's cases: the task whose files take the most stopped, an end that
waits for room, the owner told so at once. Every change is recorded through Records, under the
task's lock."""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from boxd.errors import BoxError, Problem, die
from boxd.manager.approval_answers import ApprovalAnswers
from boxd.manager.machinery import Machinery, OnMachinery
from boxd.manager.model_requests import ModelRequests
from boxd.manager.record.disk import MIB, RESERVE_BYTES, full_words, stopped_words, tree_bytes
from boxd.manager.record.ledger import TaskSave
from boxd.manager.record.records import Records
from boxd.manager.spares import SpareMaker
from boxd.manager.units.exit_words import why_failed
from boxd.manager.units.last_words import last_words
from boxd.manager.units.systemd import SystemdError
from boxd.manager.units.worker_unit import broker_units, task_slice, worker_unit
from boxd.manager.workspaces.layers import layer_name
from boxd.paths import task_own_home
from boxd.wire.approval import TASK_ENDED, ApprovalState
from boxd.wire.event import EventKind
from boxd.wire.ids import task_user
from boxd.wire.models.task import OWNER_WORKER, Review, Task, TaskState

log = logging.getLogger(__name__)

VANISHED = "The worker's unit was gone before boxd could read how it ended."
# How often an end that could not be recorded on the full disk is tried again.
END_WAITS_FOR_ROOM_SECONDS = 1.0


async def _until_room(
    what: str, record: Callable[[], Awaitable[object]], waiting: "asyncio.Future[None] | None"
) -> None:
    """Records, tried again every END_WAITS_FOR_ROOM_SECONDS while the disk is full; `waiting`
    is set the first time it has to wait."""
    told = False
    while True:
        try:
            await record()
            return
        except BoxError as failure:
            if failure.problem != Problem.FULL:
                raise
        if not told:
            told = True
            log.warning("%s waits for room on the full disk to be recorded", what)
            if waiting is not None and not waiting.done():
                waiting.set_result(None)
        await asyncio.sleep(END_WAITS_FOR_ROOM_SECONDS)


def _task_bytes(upper: Path, own_home: Path) -> int:
    return tree_bytes(upper) + tree_bytes(own_home)


def _log_failure(what: str, job: "asyncio.Future[Any]") -> None:
    """A job no one awaits any more says how it failed in the log."""
    if not job.cancelled() and (failure := job.exception()) is not None:
        log.error("%s failed: %s", what, failure)


class Ending(OnMachinery):
    def __init__(
        self,
        machinery: Machinery,
        records: Records,
        approvals: ApprovalAnswers,
        model_requests: ModelRequests,
        spare_maker: SpareMaker,
        freed: Callable[[str], None],
        starting_saw: Callable[[], set[str]],
    ) -> None:
        super().__init__(machinery)
        self.records = records
        self.approvals = approvals
        self.model_requests = model_requests
        self.spare_maker = spare_maker
        # Called once an ended task's place is free (Lifecycle's).
        self.freed = freed
        # The done tasks whose layers the tasks starting now are mounting (Lifecycle's).
        self.starting_saw = starting_saw
        # Owners' stops and undos whose task's end waits for room on a full disk, by task id:
        # what they were told.
        self._ending_on_full: dict[str, str] = {}
        # Ended tasks whose clearing up goes on without their lock (_leave), by task id.
        self._leaving: dict[str, asyncio.Future[None]] = {}

    def check_soon(self, task_id: str) -> None:
        self.background(self._check(task_id))

    async def _check(self, task_id: str) -> None:
        """A worker unit changed: if it has finished, the task ends done or failed."""
        try:
            async with self.records.locks[task_id]:
                task = await self.store.task(task_id)
                if task is None or task.state.ended or task.state == TaskState.QUEUED:
                    return
                unit = worker_unit(task_id)
                status = await self.systemd.status(unit)
                if status is None:
                    # Gone, and systemd never said how it ended: nothing will tell us later.
                    log.warning("the worker unit of task %s is gone without an exit", task_id)
                    await self.end(task, TaskState.FAILED, VANISHED)
                    return
                if not status.finished:
                    return
                if status.succeeded:
                    await self.end(task, TaskState.DONE, None)
                else:
                    log.info("the worker of task %s ended: %s", task_id, status)
                    words = (
                        None
                        if status.active_state == "inactive"
                        else await last_words(unit, task_user(task_id))
                    )
                    error = why_failed(status, words)
                    # What the worker said last is often not why (dd's byte count, a traceback's
                    # last frame): a full disk is said first, in the box's words.
                    if await asyncio.to_thread(self.task_os.disk_full, self.home):
                        error = full_words(error)
                    await self.end(task, TaskState.FAILED, error)
        except Exception:
            log.exception("could not follow the worker of task %s", task_id)

    async def end(
        self,
        task: Task,
        state: TaskState,
        error: str | None,
        waiting: "asyncio.Future[None] | None" = None,
    ) -> Task:
        """Stops the worker, then records the end: a done task's changes join its workspace in
        the same transaction; anything else's are thrown away. Then the broker's socket closes.
        `waiting` is set if the record has to wait for room on a full disk."""
        unit = worker_unit(task.id)
        self.systemd.unwatch(unit)
        await self.let_go(unit)
        recorded = full = False
        try:
            await self.layers.unmount(task.id)
            # On a full disk the task's files go before its end is recorded rather than after:
            # the record needs room, and they may hold all there is (its home is its own user's
            # to fill, all of a file system with no root reserve). Its home goes however it
            # ends; changes thrown away, with a mark that keeps it from resuming (throw_away).
            full = await asyncio.to_thread(self.task_os.disk_full, self.home)
            if full:
                await self.task_os.remove_home(self.home, task.id)
            if state == TaskState.DONE:
                # Its worker is stopped: the upper folder is root's to walk now, and walked
                # before the workspace's lock, which a big layer would hold up.
                await self.views.open_layer(task.workspace, self.layers.upper(task.id))
                async with self.layers.joins[task.workspace]:
                    layer = await self.store.next_layer(task.workspace)
                    await self.layers.join(task.id, task.workspace, layer_name(layer))
                    task = await self._record_end(task, state, error, layer, waiting)
                    recorded = True
        except (BoxError, OSError) as failure:
            message = failure.message if isinstance(failure, BoxError) else str(failure)
            state, error = TaskState.FAILED, f"Its changes could not be kept: {message}"
        if not recorded:
            if full:
                await self.layers.throw_away(task.id)
            task = await self._record_end(task, state, error, None, waiting)
        if recorded:
            await self.views.remake(task.workspace)
        await self.clear_ended(task)
        await self.collect_layers(task.workspace)
        # The layer it left or threw away may have given back the space boxd keeps in reserve.
        await self.store.keep_reserve()
        self.freed(task.id)
        return task

    async def clear_ended(self, task: Task) -> None:
        """What an ended task leaves once its end is recorded: its approvals closed, its worker
        stopped, then, without the task's lock (_leave), the rest. Safe to run again: `recover`
        runs it for tasks whose end the manager recorded and then died (SIGKILL, a power cut)."""
        if task.state != TaskState.DONE:
            await self.layers.discard(task.id)
        await self.layers.joined(task.id)
        pending = await self.store.approvals(ApprovalState.PENDING, task.id)
        if pending:
            await self.approvals.answer(task, tuple(pending), ApprovalState.DENIED, TASK_ENDED)
        # systemd keeps a slice active, and loaded, until it is stopped: one unit more for good
        # with every task that ever ran.
        for name in (worker_unit(task.id), task_slice(task.id)):
            await self.let_go(name)
        if task.id not in self._leaving:
            job = self.background(self._leave(task))
            self._leaving[task.id] = job
            job.add_done_callback(lambda _: self._leaving.pop(task.id, None))

    async def _leave(self, task: Task) -> None:
        """The end of clearing an ended task: its broker's units stopped, its home gone, a
        failed task's user gone, and last its network namespace, so a namespace left says this
        was cut off. Runs beside the task's lock, never under it: a broker told to stop first
        lets its running tools record their results (FinishCall), which takes that lock."""
        self.spare_maker.forget(task.id)
        try:
            for name in broker_units(task.id):
                await self.let_go(name)
            # A broker that could not say how its model replies ended (killed) left them open.
            await self.model_requests.settle_gone(task.id)
            await self.task_os.remove_home(self.home, task.id)
            if task.state != TaskState.DONE:
                # Its worker is stopped and its layer thrown away: its user owns nothing now.
                await self.task_os.remove_task_user(task.id)
            try:
                await self.task_os.remove_netns(task.id)
            except BoxError as failure:
                log.warning("%s", failure.message)
        except Exception:
            log.exception("could not clear up what task %s left", task.id)

    async def cleared(self, task_id: str) -> None:
        """Returns once an ended task is cleared up; called after letting go of its lock."""
        job = self._leaving.get(task_id)
        if job is not None:
            await asyncio.shield(job)

    async def cut_off_ends(self) -> list[Task]:
        """Ended tasks whose clearing up the manager did not finish: a network namespace, a
        home or an approval still pending is left."""
        named = set(await asyncio.to_thread(self.task_os.netns_ids))
        named |= {a.task for a in await self.store.approvals(ApprovalState.PENDING)}
        homes = self.home / "tasks"
        named |= {
            path.parent.name for path in await asyncio.to_thread(lambda: list(homes.glob("*/home")))
        }
        found = [await self.store.task(task_id) for task_id in sorted(named)]
        return [task for task in found if task is not None and task.state.ended]

    def free_disk_soon(self) -> None:
        self.background(self._free_disk())

    async def _free_disk(self) -> None:
        """The record could not grow: the disk is full. The unfinished task whose files (its
        changes and its home) take the most space is stopped, whether or not its agent gave up
        on its own, so the others and the record can go on."""
        try:
            sizes = []
            for task in await self.store.tasks((TaskState.RUNNING, TaskState.WAITING)):
                used = await asyncio.to_thread(
                    _task_bytes, self.layers.upper(task.id), task_own_home(self.home, task.id)
                )
                sizes.append((used, task.id))
            if not sizes:
                return
            used, task_id = max(sizes)
            if used < RESERVE_BYTES:
                # What filled the disk is not a task's (a file of the owner's, another
                # program's): stopping one would free next to nothing and lose its work.
                log.warning(
                    "the disk is full, and no unfinished task's files take %d MiB or more: "
                    "none is stopped",
                    RESERVE_BYTES // MIB,
                )
                return
            async with self.records.locks[task_id]:
                task = await self.records.task(task_id)
                if task.state.ended:
                    return
                log.warning(
                    "the disk is full: stopping task %s, whose files take the most", task_id
                )
                await self.end(task, TaskState.FAILED, stopped_words(used // MIB))
        except Exception:
            log.exception("could not free the disk")

    async def _record_end(
        self,
        task: Task,
        state: TaskState,
        error: str | None,
        layer: int | None,
        waiting: "asyncio.Future[None] | None" = None,
    ) -> Task:
        update: dict[str, Any] = {"state": state, "error": error, "endedAt": time.time()}
        if task.folders and state == TaskState.DONE:
            update["review"] = Review.PENDING
        task = task.model_copy(update=update)
        data: dict[str, Any] = {"state": state.value}
        if error:
            data["error"] = error
        # The task's worker is stopped and its units let go: an end left unrecorded would
        # show it running for good, so it waits for room, however it comes (a task's changes
        # thrown away, the owner's files removed by hand).
        await _until_room(
            f"the end of task {task.id}",
            lambda: self.records.record(TaskSave(task, EventKind.TASK_STATE, data, layer=layer)),
            waiting,
        )
        return task

    async def let_go(self, unit: str) -> None:
        try:
            await self.systemd.stop_unit(unit)
            await self.systemd.reset_failed(unit)
        except SystemdError as failure:
            log.warning("could not clean up %s: %s", unit, failure)

    async def unless_waiting_for_room(
        self,
        task_id: str,
        change: "Callable[[asyncio.Future[None]], Awaitable[dict[str, Any]]]",
        words: str,
    ) -> dict[str, Any]:
        """What the owner's `change` to a task (a stop, an undo) answers; or, once the task's
        end has to wait for room on a full disk to be recorded, a 507 in `words`, and the change
        goes on in its own job until there is room. Asked again meanwhile, the owner gets the
        same words at once, rather than wait behind the task's lock until the call times out."""
        if task_id in self._ending_on_full:
            die(Problem.FULL, self._ending_on_full[task_id])
        waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        job = self.background(change(waiting))
        await asyncio.wait((job, waiting), return_when=asyncio.FIRST_COMPLETED)
        if job.done():
            return job.result()
        self._ending_on_full[task_id] = words
        job.add_done_callback(lambda _: self._ending_on_full.pop(task_id, None))
        job.add_done_callback(partial(_log_failure, f"the owner's change to task {task_id}"))
        die(Problem.FULL, words)

    async def end_by_broker(self, task_id: str, error: str) -> None:
        try:
            async with self.records.locks[task_id]:
                task = await self.records.task(task_id)
                if not task.state.ended:
                    await self.end(task, TaskState.FAILED, error)
        except Exception:
            log.exception("could not end task %s", task_id)

    async def collect_layers(self, workspace: str) -> None:
        """Deletes the files of layers that left the stack (undone, kept), once no unfinished
        task stacks them: a running task's view must not change under it."""
        unfinished = (TaskState.QUEUED, TaskState.RUNNING, TaskState.WAITING)
        async with self.layers.joins[workspace]:
            dropped = await self.store.dropped_layers(workspace)
            if not dropped:
                return
            needed = {done for t in await self.store.tasks(unfinished) for done in t.saw}
            needed.update(self.starting_saw())
            for number, task_id in dropped:
                if task_id not in needed:
                    await self.layers.remove(workspace, layer_name(number))
                    # Its files are gone with its layer: nothing of its user's is left. An
                    # owner's change never had a user of its own.
                    task = await self.store.task(task_id)
                    if task is None or task.worker != OWNER_WORKER:
                        await self.task_os.remove_task_user(task_id)
