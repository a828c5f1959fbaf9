"""The start of a task's life: admission to one of the maxRunningTasks places, then its start
(its user, view, namespace and units, or a spare's made ahead), and at start-up the tasks boxd
was running picked up again. Its end, and the clearing up of what it leaves, are ending.py's.
Every change is recorded through Records, under the task's lock."""

import asyncio
import grp
import logging
from functools import partial

from boxd.errors import BoxError, Problem, die
from boxd.manager.access.vault import Vault
from boxd.manager.admission import next_to_start
from boxd.manager.agent_install import CLAUDE, AgentInstall, InstallState, sort_queue
from boxd.manager.approval_answers import ApprovalAnswers
from boxd.manager.at_once import at_once
from boxd.manager.ending import Ending
from boxd.manager.folders.folders import real_folders
from boxd.manager.folders.keep import save_manifest, take_manifest
from boxd.manager.folders.mirror import MirrorError, sync_mirror
from boxd.manager.folders.owner_process import OwnerError, as_owner_work
from boxd.manager.machinery import Machinery, OnMachinery
from boxd.manager.model_requests import ModelRequests
from boxd.manager.record.ledger import TaskSave
from boxd.manager.record.records import Records
from boxd.manager.spares import Ahead, SpareMaker
from boxd.manager.units import at_rest, disk_quota
from boxd.manager.units.systemd import SystemdError
from boxd.manager.units.users import FIRST_UID, LAST_UID, id_taken, task_uid
from boxd.manager.units.worker_unit import (
    WORK_GROUP,
    broker_service_unit,
    wake_signal,
    worker_properties,
    worker_unit,
)
from boxd.manager.workspaces.layers import MAX_DONE, layer_name
from boxd.paths import task_manifest, task_work_dir, workspaces_dir
from boxd.wire.event import EventKind
from boxd.wire.ids import task_user
from boxd.wire.model_key import missing_key
from boxd.wire.models.settings import Settings
from boxd.wire.models.task import Task, TaskState
from boxd.wire.models.task_request import Worker

log = logging.getLogger(__name__)


def _full(workspace: str) -> str:
    return (
        f"Workspace {workspace} already holds {MAX_DONE} finished tasks, the most it can "
        "stack: undo some of them, or start the task on another workspace."
    )


def _words(error: Exception) -> str:
    return error.message if isinstance(error, BoxError) else str(error)


class Lifecycle(OnMachinery):
    def __init__(
        self,
        machinery: Machinery,
        records: Records,
        approvals: ApprovalAnswers,
        model_requests: ModelRequests,
        vault: Vault,
        spare_maker: SpareMaker,
    ) -> None:
        super().__init__(machinery)
        self.records = records
        self.vault = vault
        self.spare_maker = spare_maker
        # The `saw` of tasks between reading their stack and recording it, by task id.
        self._starting: dict[str, list[str]] = {}
        # Tasks that hold one of the maxRunningTasks places: starting, running or waiting.
        self._places: set[str] = set()
        # Tasks given a place and not yet started, each with what is set once its start is over:
        # the request that created a task answers with it started, whoever's request starts it.
        self._starts: dict[str, asyncio.Event] = {}
        # Held while places are given; the owner's pause and resume take it too.
        self.admission = asyncio.Lock()
        self.droid = AgentInstall(self.systemd, self.start_queued_soon)
        self.claude = AgentInstall(self.systemd, self.start_queued_soon, agent=CLAUDE)
        self.ending = Ending(
            machinery,
            records,
            approvals,
            model_requests,
            spare_maker,
            self._freed,
            self._starting_saw,
        )

    def take_place(self, task_id: str) -> None:
        """A task recorded running or waiting as the manager opens holds its place."""
        self._places.add(task_id)

    def _freed(self, task_id: str) -> None:
        """An ended task's place is free: queued tasks may start."""
        self._places.discard(task_id)
        self.start_queued_soon()

    def _starting_saw(self) -> set[str]:
        """The done tasks whose layers the tasks starting now are mounting."""
        return {done for saw in self._starting.values() for done in saw}

    async def until_started(self, task_id: str) -> None:
        """Returns once the task's start, if an admission has taken it, is over."""
        starting = self._starts.get(task_id)
        if starting is not None:
            await starting.wait()

    async def recover(self) -> None:
        """Picks up tasks that were running when boxd stopped. systemd kept their units; a worker
        that is gone without a trace (the machine restarted) is started again and resumes from
        its logged steps. Tasks that ended as boxd stopped are cleared up, and what a manager
        cut off left of queued tasks' units goes."""
        for task in await self.ending.cut_off_ends():
            log.info("task %s ended as boxd stopped; clearing up what it left", task.id)
            async with self.records.locks[task.id]:
                await self.ending.clear_ended(task)
            await self.ending.cleared(task.id)
        for task in await self.store.tasks((TaskState.RUNNING, TaskState.WAITING)):
            self.systemd.watch(worker_unit(task.id), partial(self.ending.check_soon, task.id))
            if await self.systemd.status(worker_unit(task.id)) is None:
                log.info("task %s has no worker unit; starting it again to resume", task.id)
                async with self.records.locks[task.id]:
                    try:
                        layers = await self._layers_seen(task)
                        async with self.layers.joins[task.workspace]:
                            if await self.layers.take_back(task.id, task.workspace):
                                log.info(
                                    "task %s: took back its layer from a cut-off join", task.id
                                )
                            await self._prepare_view(task, layers)
                        await self._start_units(task)
                    except (BoxError, SystemdError, OSError) as error:
                        await self.ending.end(
                            task, TaskState.FAILED, f"The task could not resume: {error}"
                        )
            else:
                self.ending.check_soon(task.id)
        for task in await self.store.tasks((TaskState.QUEUED,)):
            # A manager cut off between starting a queued task's worker and recording it
            # running left that worker: the task starts again from its record, so the unit goes.
            if await self.systemd.status(worker_unit(task.id)) is not None:
                log.info("task %s is queued but has a worker unit; stopping it first", task.id)
                await self.ending.let_go(worker_unit(task.id))
            # Its id may have been a spare of an earlier manager, whose broker, started ahead, holds
            # the vault of then: it goes, and the task's start starts a new one.
            if await self.systemd.status(broker_service_unit(task.id)) is not None:
                await self.ending.let_go(broker_service_unit(task.id))

    async def _admit(self) -> list[Task]:
        """Gives the free places to the oldest queued tasks; returns them, oldest first, after
        the Droid tasks that cannot run, which _start fails. Droid tasks wait for its install
        without a place, and every task waits while the agents are paused or a check of the
        machine that blocks tasks fails."""
        async with self.admission:
            limit = (await self.store.settings()).maxRunningTasks
            queued = await self.store.tasks((TaskState.QUEUED,))
            # While the machine cannot sandbox them, they wait queued (boxd.manager.doctor).
            if queued and await self.doctor.refusal() is not None:
                return []
            paused = await self.store.agents_paused()
            may_start, refused = sort_queue(queued, self.installs(), paused)
            if any(task.worker == Worker.CLAUDE for task in queued):
                self.background(self.claude.begin_once())
            chosen = next_to_start(may_start, self._places, limit)
            refused = [task for task in refused if task.id not in self._places]
            self._places.update(task.id for task in (*refused, *chosen))
            for task in (*refused, *chosen):
                self._starts.setdefault(task.id, asyncio.Event())
            return [*refused, *chosen]

    async def start_queued(self) -> None:
        admitted = await self._admit()
        try:
            for task in admitted:
                await self._start(task)
                self._started(task.id)
        finally:
            # Whatever happened, no request waits for ever on a start that will not come.
            for task in admitted:
                self._started(task.id)

    def _started(self, task_id: str) -> None:
        started = self._starts.pop(task_id, None)
        if started is not None:
            started.set()

    def start_queued_soon(self) -> None:
        self.background(self.start_queued())

    async def _start(self, task: Task) -> Task:
        """Starts a queued task that has been given a place."""
        async with self.records.locks[task.id]:
            current = await self.store.task(task.id)
            if current is None or current.state != TaskState.QUEUED:
                # Stopped while it waited for its place.
                self._places.discard(task.id)
                return current or task
            task = current
            install = self.installs().get(task.worker)
            if install is not None:
                refusal = install.task_error or await self._droid_key_missing()
                if refusal is not None:
                    return await self.ending.end(task, TaskState.FAILED, refusal)
            failure: str | None = None
            async with self.layers.joins[task.workspace]:
                stack = await self.store.stack(task.workspace)
                if len(stack) >= MAX_DONE:
                    failure = _full(task.workspace)
                else:
                    task = task.model_copy(update={"saw": [done for _, done in stack]})
                    self._starting[task.id] = task.saw
                    try:
                        if task.folders:
                            await self._mirror(task)
                        await self._prepare_view(task, [layer_name(n) for n, _ in stack])
                    except (BoxError, OSError) as error:
                        failure = f"The task could not start: {_words(error)}"
            try:
                if failure is not None:
                    return await self.ending.end(task, TaskState.FAILED, failure)
                try:
                    await self._start_units(task)
                # ValueError: a worker boxd has no command for (worker_unit.worker_command).
                except (BoxError, SystemdError, OSError, ValueError) as error:
                    return await self.ending.end(
                        task, TaskState.FAILED, f"The task could not start: {_words(error)}"
                    )
                task = task.model_copy(update={"state": TaskState.RUNNING})
                await self.records.record(
                    TaskSave(task, EventKind.TASK_STATE, {"state": "running"})
                )
            finally:
                self._starting.pop(task.id, None)
            return task

    def installs(self) -> dict[str, InstallState]:
        """The agents boxd installs, by worker, as their installs stand."""
        return {Worker.DROID: self.droid.state, Worker.CLAUDE: self.claude.state}

    async def _droid_key_missing(self) -> str | None:
        """Why a Droid task cannot start for want of a model key in the vault, or None."""
        return missing_key(await asyncio.to_thread(self.vault.names))

    async def _mirror(self, task: Task) -> None:
        """Brings the copy of the owner's folders up to date before a personal task starts."""
        assert task.folders is not None
        if task.askerUid is None:
            die(
                Problem.FAILED,
                "it was asked for before boxd recorded which account asked, so its folders are "
                "not read for it; start it again",
            )
        base = workspaces_dir(self.home) / task.workspace
        gid = grp.getgrnam(WORK_GROUP).gr_gid
        folders = real_folders(task.folders)
        try:
            await as_owner_work(sync_mirror, folders, base, gid, task.askerUid)
        except (MirrorError, OwnerError) as error:
            die(Problem.FAILED, str(error))

    async def _prepare_view(self, task: Task, layers: list[str]) -> None:
        """The task's user, its home, its view of the workspace and its network namespace, made
        at once: none needs another once the user's uid is known, and a file given to that uid
        before useradd has run belongs to no one else, since no one else ever gets it. For a
        personal task, then a manifest of what it saw, to find conflicts when the owner keeps
        it. Under the workspace's lock. A failure is raised once every step is over, so the
        task's end undoes them all."""
        user = task_user(task.id)
        directory = at_rest.task_directory(self.home, task.id)
        uid = await task_uid(
            user, partial(self.store.claim_uid, task.id, FIRST_UID, LAST_UID, id_taken)
        )
        # A spare's user and namespace were made ahead, in this run (spares.py).
        made_ahead = self.spare_maker.made_ahead(task.id)
        quota = (await self.store.settings()).taskDiskQuotaBytes
        if quota is not None:
            await self._limit_disk(task.id, uid, quota)
        await at_once(
            self.task_os.ensure_user(user, directory, uid),
            self.task_os.prepare_home(self.home, task.id, uid, project=quota is not None),
            self.layers.mount(task.id, task.workspace, layers, uid, project=quota is not None),
            *([] if made_ahead else [self.task_os.ensure_netns(task.id)]),
        )
        manifest = task_manifest(self.home, task.id)
        if task.folders and not manifest.exists():
            seen = await asyncio.to_thread(take_manifest, task_work_dir(self.home, task.id))
            await asyncio.to_thread(save_manifest, seen, manifest)

    async def _limit_disk(self, task_id: str, uid: int, quota: int) -> None:
        """The most the task's home and changes may take of the disk together (its project
        is its uid: boxd.manager.units.disk_quota)."""
        try:
            await asyncio.to_thread(disk_quota.limit, self.home, uid, quota)
        except OSError as error:
            die(
                Problem.FAILED,
                f"could not give task {task_id} its disk quota (taskDiskQuotaBytes): "
                f"{error.strerror or error}",
            )

    async def _start_units(self, task: Task) -> None:
        """Starts the worker, and with it, in the same job, its broker and the broker's sockets
        (worker_unit.worker_properties): one call to systemd rather than one per unit. The
        broker's start-up overlaps the worker's rather than waiting for its first connection."""
        # The one place every worker of a task starts, woken or new, resumed or not. Its words
        # become the task's failure, which whoever started it reads, an app's token maybe.
        await self.doctor.refuse_if_failing(to_owner=False)
        unit = worker_unit(task.id)
        settings = await self.store.settings()
        # The vault holds still from the count's check to the worker's start: a secret removed
        # once the owner was told so never reaches this task through a broker started before.
        async with self.vault.unchanged() as changes:
            ahead = self.spare_maker.take_ahead(task.id)
            if ahead is not None and not ahead.broker_holds(changes, self.systemd.reloads):
                # A spare's broker holds the secrets and the unit of when it started: the vault
                # changed since, or systemd reloaded its units (a drop-in's Environment=, say), so
                # it goes, and its socket starts a new one on the worker's first connection.
                await self.systemd.stop_unit(broker_service_unit(task.id))
            if ahead is not None and await self._wake_ahead(task, ahead, settings):
                return
            self.systemd.watch(unit, partial(self.ending.check_soon, task.id))
            await self.systemd.start_transient(unit, worker_properties(self.home, task, settings))

    async def _wake_ahead(self, task: Task, ahead: Ahead, settings: Settings) -> bool:
        """Makes the spare's worker started ahead this task's worker, if it still can be (see
        SpareMaker.why_not_woken). Otherwise it goes, and False says to start one."""
        unit = worker_unit(task.id)
        why = await self.spare_maker.why_not_woken(task, ahead, settings)
        if why is None:
            self.systemd.watch(unit, partial(self.ending.check_soon, task.id))
            try:
                await self.systemd.signal_main(unit, wake_signal(task))
                return True
            except SystemdError as failure:
                why = str(failure)
        log.info("task %s: starting a new worker, not the one started ahead: %s", task.id, why)
        # No longer the spare's to watch, nor yet the task's: its stop is nobody's news.
        self.systemd.unwatch(unit)
        await self.ending.let_go(unit)
        return False

    async def _layers_seen(self, task: Task) -> list[str]:
        """The layers a task saw when it started, to mount its view again after a restart."""
        names = []
        for done in task.saw:
            found = await self.store.layer_of(done)
            if found is None or not found[1]:
                die(Problem.FAILED, f"task {done}, whose changes it saw, was undone since")
            names.append(layer_name(found[0]))
        return names
