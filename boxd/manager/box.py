"""The box: the life of tasks. It creates them, starts their users, views and units, follows the
units, ends them, undoes and keeps them. Every change is recorded through Records, under the
task's lock; what brokers ask is in broker_methods, the owner's answers in approval_answers."""

import asyncio
import contextlib
import grp
import logging
import pwd
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from dbus_fast import Variant
from dbus_fast.aio import MessageBus

from boxd.dbus import interface as api
from boxd.errors import NO_ROOM_TO_START, BoxError, Problem, die, is_full
from boxd.manager import at_rest, disk_quota, netns, task_home
from boxd.manager.admission import next_to_start
from boxd.manager.app_runners import AppRunners
from boxd.manager.approval_answers import ApprovalAnswers
from boxd.manager.at_once import at_once
from boxd.manager.broker_methods import BrokerMethods
from boxd.manager.damaged import DAMAGED
from boxd.manager.diffs import diff_page
from boxd.manager.disk import (
    MIB,
    RESERVE_BYTES,
    disk_full,
    full_words,
    stopped_words,
    tree_bytes,
)
from boxd.manager.droid_install import DroidInstall, sort_queue
from boxd.manager.exit_words import why_failed
from boxd.manager.folders import (
    asker_only,
    asking_account,
    caller_uid,
    check_folders,
    folder_workspace,
    look_as,
    real_folders,
)
from boxd.manager.keep import (
    KeepError,
    Places,
    keep,
    layer_changes,
    load_manifest,
    save_manifest,
    take_manifest,
)
from boxd.manager.keyed_locks import KeyedLocks
from boxd.manager.last_words import last_words
from boxd.manager.layers import MAX_DONE, Layers, layer_name
from boxd.manager.mirror import MirrorError, sync_mirror
from boxd.manager.model_requests import ModelRequests
from boxd.manager.owner_process import OwnerError, as_owner_work
from boxd.manager.pages import one_page, with_next
from boxd.manager.pairing import LIFETIME, Pairings, check_device_name
from boxd.manager.records import Records
from boxd.manager.screen_sessions import ScreenSessions
from boxd.manager.spares import Spares, leftovers
from boxd.manager.store import Store, TaskIdTaken
from boxd.manager.systemd import Systemd, SystemdError
from boxd.manager.tokens import (
    DEVICE,
    check_member_id,
    check_token_name,
    find_token,
    new_token,
    token_hash,
    token_role,
)
from boxd.manager.users import (
    FIRST_UID,
    LAST_UID,
    ensure_user,
    id_taken,
    remove_user,
    task_uid,
)
from boxd.manager.vault import Vault
from boxd.manager.worker_ahead import catches, not_ready
from boxd.manager.worker_unit import (
    ALL_TASKS_SLICE,
    WORK_GROUP,
    ahead_worker_properties,
    all_tasks_properties,
    broker_service_unit,
    broker_units,
    task_slice,
    wake_signal,
    worker_properties,
    worker_unit,
)
from boxd.manager.workspaces import PERSONAL, SHARED, Workspaces
from boxd.paths import task_dir, task_manifest, task_own_home, task_work_dir, workspaces_dir
from boxd.reading.strict_json import loads
from boxd.wire.approval import TASK_ENDED, ApprovalState
from boxd.wire.caller import OWNER_ONLY, Caller, Role
from boxd.wire.claude_models import DEFAULT_MODEL, resolve_model
from boxd.wire.event import EventKind
from boxd.wire.ids import new_task_id, task_user
from boxd.wire.model_key import KEY_REFUSED, missing_key
from boxd.wire.models.settings import NetworkDefault, Settings, change_settings
from boxd.wire.models.task import Review, Task, TaskState
from boxd.wire.models.task_request import TaskRequest, Worker, parse_task_request
from boxd.wire.models.token_limits import DEFAULT, TokenLimits, check_task, holder, parse_limits
from boxd.workers.ahead import WAKES

PHONE = "phone:"
log = logging.getLogger(__name__)

Handler = Callable[[Caller, list[Any]], Awaitable[Any]]

STOPPED = "Stopped by its owner."
VANISHED = "The worker's unit was gone before boxd could read how it ended."
UNDONE_WHILE_RUNNING = "Stopped by its owner, to undo it."
# How long a spare waits for its worker started ahead to be ready (its imports: 0.1 to 0.3 s at
# rest, seconds under load), and how often it looks.
AHEAD_READY_SECONDS = 30.0
AHEAD_POLL_SECONDS = 0.02
# How often an end that could not be recorded on the full disk is tried again.
END_WAITS_FOR_ROOM_SECONDS = 1.0


def undo_waits_for_room(task_id: str) -> str:
    """As stop_waits_for_room, for an undo."""
    return (
        f"Task {task_id} is stopped: its worker no longer runs. The box's disk is full, so it "
        "is undone once there is room to record its end (free space by undoing other tasks or "
        "removing workspaces); until then it still shows as running."
    )


def stop_waits_for_room(task_id: str) -> str:
    """What the owner is told of a stop whose end cannot be recorded on a full disk, at once,
    rather than nothing until the stop call times out."""
    return (
        f"Task {task_id} is stopped: its worker no longer runs. The box's disk is full, so its "
        "end is recorded once there is room (free space by undoing tasks or removing "
        "workspaces); until then it still shows as running."
    )


def _full(workspace: str) -> str:
    return (
        f"Workspace {workspace} already holds {MAX_DONE} finished tasks, the most it can "
        "stack: undo some of them, or start the task on another workspace."
    )


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


T = TypeVar("T")


class Box:
    def __init__(self, home: Path, store: Store, bus: MessageBus, systemd: Systemd) -> None:
        self.home = home
        self.store = store
        self.bus = bus
        self.systemd = systemd
        self.vault = Vault(home)
        self.apps = AppRunners(systemd, self.vault, home)
        self.vault.changed = self.apps.secrets_changed
        self.workspaces = Workspaces(home)
        self.layers = Layers(home)
        # One lock per workspace: its mirror, its stack and the mounts made from it change
        # under it, so no layer is taken away while a task is mounting it.
        self._joins = KeyedLocks()
        # The `saw` of tasks between reading their stack and recording it, by task id.
        self._starting: dict[str, list[str]] = {}
        self.records = Records(store, bus)
        self.approvals = ApprovalAnswers(self.records)
        self.broker = BrokerMethods(self.records)
        self.model_requests = ModelRequests(self.records)
        self._background: set[asyncio.Future[Any]] = set()
        # Owners' stops and undos whose task's end waits for room on a full disk, by task id:
        # what they were told.
        self._ending_on_full: dict[str, str] = {}
        # Ended tasks whose clearing up goes on without their lock (_leave), by task id.
        self._leaving: dict[str, asyncio.Future[None]] = {}
        # Tasks that hold one of the maxRunningTasks places: starting, running or waiting.
        self._places: set[str] = set()
        # Tasks given a place and not yet started, each with what is set once its start is over:
        # the request that created a task answers with it started, whoever's request starts it.
        self._starts: dict[str, asyncio.Event] = {}
        self._admission = asyncio.Lock()
        self.droid = DroidInstall(systemd, self._start_queued_soon)
        self.pairings = Pairings()
        self.screen = ScreenSessions(store)
        self.spares = Spares(self._make_spare, self._drop_spare)
        # A reload (a drop-in, a package's units) leaves the spares' brokers and workers with
        # their units as they were: made again now, not as the next tasks take them.
        systemd.reloaded = self._after_reload
        self._known_at_open: set[str] = set()
        # Tasks whose id was a spare, until their start: their user and namespace are made.
        self._made_ahead: set[str] = set()
        # Spares' brokers and workers started ahead, by id, until their task's units start: what
        # each was started with (Ahead).
        self._ahead: dict[str, Ahead] = {}

    def _in_background(self, work: "Awaitable[T]") -> "asyncio.Future[T]":
        """`work` as a job of its own, held until it ends (the loop keeps only weak references
        to tasks)."""
        job = asyncio.ensure_future(work)
        self._background.add(job)
        job.add_done_callback(self._background.discard)
        return job

    # Start-up and recovery.

    async def open(self) -> None:
        (self.home / "tasks").mkdir(parents=True, exist_ok=True)
        at_rest.restrict(self.home, at_rest.BOX_HOME)
        at_rest.restrict(self.home / "tasks", at_rest.TASKS)
        self.workspaces.open()
        self.layers.open()
        self.vault.open()
        await self.systemd.subscribe()
        await self.apps.open()
        await self._limit_all_tasks(await self.store.settings())
        self.store.on_full = self._free_disk_soon
        for task in await self.store.tasks():
            self._known_at_open.add(task.id)
            self.records.export(task)
            if task.state in (TaskState.RUNNING, TaskState.WAITING):
                self._places.add(task.id)
        for task_id, state in await self.store.damaged_tasks():
            await self._fail_damaged(task_id, state)

    async def _fail_damaged(self, task_id: str, state: str) -> None:
        """A task whose record cannot be read is stopped and recorded failed, saying so; the
        manager goes on with the others."""
        log.error("task %s is damaged: its record in box.db cannot be read; failing it", task_id)
        task = await self.store.task(task_id)
        if task is None:
            return
        try:
            async with self.records.locks[task.id]:
                if state in {s.value for s in TaskState if not s.ended}:
                    await self._end(task, TaskState.FAILED, DAMAGED)
                else:
                    await self.records.record(
                        task, EventKind.TASK_STATE, {"state": "failed", "error": DAMAGED}
                    )
        except Exception:
            log.exception("could not record damaged task %s as failed", task_id)

    async def recover(self) -> None:
        """Picks up tasks that were running when boxd stopped. systemd kept their units; a worker
        that is gone without a trace (the machine restarted) is started again and resumes from
        its logged steps. Tasks that ended as boxd stopped are cleared up. Then queued tasks
        start, oldest first, as places are free."""
        for task in await self._cut_off_ends():
            log.info("task %s ended as boxd stopped; clearing up what it left", task.id)
            async with self.records.locks[task.id]:
                await self._clear_ended(task)
            await self._cleared(task.id)
        for task in await self.store.tasks((TaskState.RUNNING, TaskState.WAITING)):
            self.systemd.watch(worker_unit(task.id), partial(self._check_soon, task.id))
            if await self.systemd.status(worker_unit(task.id)) is None:
                log.info("task %s has no worker unit; starting it again to resume", task.id)
                async with self.records.locks[task.id]:
                    try:
                        layers = await self._layers_seen(task)
                        async with self._joins[task.workspace]:
                            if await self.layers.take_back(task.id, task.workspace):
                                log.info(
                                    "task %s: took back its layer from a cut-off join", task.id
                                )
                            await self._prepare_view(task, layers)
                        await self._start_units(task)
                    except (BoxError, SystemdError, OSError) as error:
                        await self._end(
                            task, TaskState.FAILED, f"The task could not resume: {error}"
                        )
            else:
                self._check_soon(task.id)
        for task in await self.store.tasks((TaskState.QUEUED,)):
            # A manager cut off between starting a queued task's worker and recording it
            # running left that worker: the task starts again from its record, so the unit goes.
            if await self.systemd.status(worker_unit(task.id)) is not None:
                log.info("task %s is queued but has a worker unit; stopping it first", task.id)
                await self._let_go(worker_unit(task.id))
            # Its id may have been a spare of an earlier manager, whose broker, started ahead, holds
            # the vault of then: it goes, and the task's start starts a new one.
            if await self.systemd.status(broker_service_unit(task.id)) is not None:
                await self._let_go(broker_service_unit(task.id))
        await self.model_requests.settle_all_gone()
        await self.droid.begin()
        await self._start_queued()
        self._in_background(self._renew_spares())

    async def _renew_spares(self) -> None:
        """Removes the spares an earlier manager left (spares.py says why), then makes new."""

        def accounts() -> list[tuple[str, int]]:
            users = [(user.pw_name, user.pw_uid) for user in pwd.getpwall()]
            return users + [(group.gr_name, group.gr_gid) for group in grp.getgrall()]

        found = leftovers(
            await asyncio.to_thread(accounts),
            await asyncio.to_thread(netns.task_ids),
            self._known_at_open,
        )
        for task_id in found:
            if await self.store.task(task_id) is None:
                log.info("removing spare task user %s, left by an earlier run", task_user(task_id))
                await self.spares.drop_leftovers([task_id])
        self.spares.fill_soon()

    async def _make_spare(self, task_id: str) -> None:
        uid = await self.store.claim_uid(task_id, FIRST_UID, LAST_UID, id_taken)
        directory = self._task_directory(task_id)
        await at_once(ensure_user(task_user(task_id), directory, uid), netns.ensure(task_id))
        # Its broker and sockets too, so the task's first request does not wait for the broker's
        # start-up (some 300 ms: its sandbox, its imports, the bus). It serves nothing until its
        # task's worker connects (boxd/broker/main.py); its sockets are the spare's user's and in
        # its namespace. The vault's count is read first: a change made after that is seen.
        worker = ahead_worker_properties(self.home, task_id, await self.store.settings())
        self._ahead[task_id] = Ahead(self.vault.changes, self.systemd.reloads, worker)
        for unit in broker_units(task_id):
            await self.systemd.start_unit(unit)
        # And its worker, which imports its code and waits, as the spare's user and in the
        # worker's sandbox, in the empty mount point of its view, until its task's view is
        # mounted there and it is told which worker to be (boxd/workers/ahead.py).
        await task_home.prepare(self.home, task_id, uid)
        await asyncio.to_thread(self.layers.mount_point, task_id)
        # Watched from before its start: one that ends while it waits (killed, its memory
        # short) is no spare, and is made again rather than found so by the task that takes it.
        self.systemd.watch(worker_unit(task_id), partial(self._spare_worker_changed, task_id))
        await self.systemd.start_transient(worker_unit(task_id), worker)
        await self._until_waiting(worker_unit(task_id))

    def _spare_worker_changed(self, task_id: str) -> None:
        self._in_background(self._renew_if_ended(task_id))

    async def _renew_if_ended(self, task_id: str) -> None:
        status = await self.systemd.status(worker_unit(task_id))
        if status is None or status.finished:
            await self._renew_spare(task_id, "its worker ended")

    def _after_reload(self) -> None:
        self._in_background(self._renew_stale_spares())

    async def _renew_stale_spares(self, settings: Settings | None = None) -> None:
        """Makes again the spares whose worker's unit is not the one a task would get now, with
        `settings` or the box's."""
        if settings is None:
            settings = await self.store.settings()
        for task_id in self.spares.ready():
            ahead = self._ahead.get(task_id)
            now = ahead_worker_properties(self.home, task_id, settings)
            if ahead is not None and not ahead.worker_holds(self.systemd.reloads, now):
                await self._renew_spare(
                    task_id, "the box's settings or systemd's units changed since it was made"
                )

    async def _renew_spare(self, task_id: str, why: str) -> None:
        """Drops a ready spare and makes another; one a task took meanwhile is the task's."""
        if not self.spares.discard(task_id):
            return
        log.info("making spare %s again: %s", task_id, why)
        try:
            await self._drop_spare(task_id)
        except Exception as error:
            log.warning("could not remove spare %s: %s", task_id, _words(error))
        self.spares.fill_soon()

    async def _until_waiting(self, unit: str) -> None:
        """Returns once the spare's worker catches its wake-up signals, its imports done, or
        after AHEAD_READY_SECONDS all the same: a task that takes it before would find it not
        ready and start a new worker, so until then the spare is not handed out. Fails if the
        worker ends first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + AHEAD_READY_SECONDS
        while loop.time() < deadline:
            pid = await self.systemd.main_pid(unit)
            if pid is None:
                # Not forked yet, or ended already (its imports failed, it was killed): one that
                # ended is no spare, and the making stops here, as on any failure (spares.py).
                status = await self.systemd.status(unit)
                if status is None or status.finished:
                    die(Problem.FAILED, f"the worker started ahead as {unit} ended as it started")
            elif await asyncio.to_thread(catches, pid, WAKES):
                return
            await asyncio.sleep(AHEAD_POLL_SECONDS)
        log.warning("the worker started ahead as %s did not get ready in time", unit)

    async def _why_not_woken(self, task: Task, ahead: Ahead, settings: Settings) -> str | None:
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
        return await asyncio.to_thread(not_ready, pid, task_work_dir(self.home, task.id), WAKES)

    def _task_directory(self, task_id: str) -> Path:
        """The task's directory, made if it is not there, with the task's mode: its worker
        passes through to its socket, home and view; no other user lists it."""
        directory = task_dir(self.home, task_id)
        directory.mkdir(mode=at_rest.TASK, exist_ok=True)
        at_rest.restrict(directory, at_rest.TASK)
        return directory

    async def _drop_spare(self, task_id: str) -> None:
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
        await task_home.remove(self.home, task_id)
        for empty in (task_work_dir(self.home, task_id), task_dir(self.home, task_id)):
            with contextlib.suppress(OSError):
                empty.rmdir()
        await self._remove_user(task_id)
        await netns.remove(task_id)

    def routes(self) -> dict[api.Method, Handler]:
        return {
            api.CREATE_TASK: self.create_task,
            api.GET_TASK: self.get_task,
            api.LIST_TASKS: self.list_tasks,
            api.STOP_TASK: self.stop_task,
            api.UNDO_TASK: self.undo_task,
            api.KEEP_TASK: self.keep_task,
            api.DIFF_TASK: self.diff_task,
            api.LIST_APPROVALS: self.approvals.list_approvals,
            api.ANSWER_APPROVAL: self.approvals.answer_approval,
            api.LIST_WORKSPACES: self.list_workspaces,
            api.CREATE_WORKSPACE: self.create_workspace,
            api.REMOVE_WORKSPACE: self.remove_workspace,
            api.GET_SETTINGS: self.get_settings,
            api.SET_SETTINGS: self.set_settings,
            api.CREATE_TOKEN: self.create_token,
            api.LIST_TOKENS: self.list_tokens,
            api.REVOKE_TOKEN: self.revoke_token,
            api.GET_DROID: self.get_droid,
            api.CREATE_PAIRING: self.create_pairing,
            api.PAIR: self.pair,
            api.GET_AGENTS: self.get_agents,
            api.PAUSE_AGENTS: self.pause_agents,
            api.RESUME_AGENTS: self.resume_agents,
            api.SET_SECRET: self.vault.set_secret,
            api.REMOVE_SECRET: self.vault.remove_secret,
            api.LIST_SECRETS: self.vault.list_secrets,
            api.CREATE_SCREEN_LINK: self.screen.create_link,
            api.OPEN_SCREEN_SESSION: self.screen.open_session,
            api.CLOSE_SCREEN_SESSION: self.screen.close_session,
            api.BROKER_GET_TASK: self.broker.broker_task,
            api.LOG_STEP: self.broker.log_step,
            api.BEGIN_CALL: self.broker.begin_call,
            api.FINISH_CALL: self.broker.finish_call,
            api.ASK: self.broker.ask,
            api.WAIT_APPROVAL: self.approvals.wait_approval,
            api.LOG_COST: self.broker.log_cost,
            api.LOG_REFUSAL: self.broker.log_refusal,
            api.BEGIN_MODEL_REQUEST: self.model_requests.begin,
            api.LOG_MODEL_COST: self.model_requests.log_cost,
            api.MODEL_KEY_REFUSED: self.model_key_refused,
        }

    async def model_key_refused(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        """The task's model gateway found the vault's key refused upstream (401): the task
        ends failed, saying so. Ended in the background, since ending it stops the broker that
        is waiting for this answer; queued on the task's lock now, before the broker passes the
        401 to the worker, so the worker's exit that follows does not end it in other words."""
        task = await self.records.task(args[0])
        if not task.state.ended:
            self._in_background(self._end_by_broker(task.id, KEY_REFUSED))
        return task.public()

    async def _end_by_broker(self, task_id: str, error: str) -> None:
        try:
            async with self.records.locks[task_id]:
                task = await self.records.task(task_id)
                if not task.state.ended:
                    await self._end(task, TaskState.FAILED, error)
        except Exception:
            log.exception("could not end task %s", task_id)

    # The owner's methods.

    async def create_task(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        request = parse_task_request(args[0])
        settings = await self.store.settings()
        personal = request.personal
        if personal is not None or request.workspace.startswith(PERSONAL):
            _owner_only(caller)
        if personal is None and request.workspace.startswith(PERSONAL):
            die(
                Problem.INVALID,
                f"workspace {request.workspace} is the copy of your personal folders: start the "
                "task with folder or folders instead",
            )
        # Before a workspace or tool is looked up: a limited token learns nothing of the others.
        budget, hosts = allowed_for(caller, request, settings)
        if (
            personal is None
            and request.files is None
            and not self.workspaces.exists(request.workspace)
        ):
            die(Problem.INVALID, f"no workspace {request.workspace}")
        for tool in request.tools:
            self._installed(tool)
        droid = request.worker == Worker.DROID
        workspace = request.workspace
        folders: list[str] | None = None
        asker: int | None = None
        if personal is not None:
            account = await asyncio.to_thread(asking_account, caller)
            asker = account.uid
            checked = await as_owner_work(
                check_folders,
                personal,
                account,
                settings.agentFolders,
                self.home,
                partial(look_as, account.uid),
            )
            folders = [str(folder.path) for folder in checked]
            workspace = folder_workspace(checked)
        # Refused before anything is made: a task started on a full disk could neither write
        # nor be recorded, and would leave a user, units and a layer half-made.
        if await asyncio.to_thread(disk_full, self.home):
            die(Problem.FULL, NO_ROOM_TO_START)
        # A spare id comes with its user and network namespace made (spares.py).
        spare = self.spares.take()
        task_id = spare or new_task_id()
        try:
            shared: list[dict[str, Any]] = []
            if request.files is not None:
                # Shared files make a workspace of their own; the log keeps names and sizes only.
                workspace = f"files-{task_id}"
                await self.workspaces.create(workspace, files=True)
                shared = [{"name": f.name, "size": len(f.content)} for f in request.files]
            task = Task(
                id=task_id,
                title=request.title,
                prompt=request.prompt,
                state=TaskState.QUEUED,
                user=task_user(task_id),
                workspace=workspace,
                worker=request.worker,
                tools=list(request.tools),
                hosts=hosts,
                source=_source(caller, request.source),
                model=request.model or (resolve_model(DEFAULT_MODEL) if droid else None),
                budgetCents=budget,
                seat=request.seat,
                droid=request.droid if droid else None,
                folder=folders[0] if folders else None,
                folders=folders,
                app=caller.name if caller.role == Role.APP else None,
                requester=caller.name if caller.role == Role.MEMBER else None,
                createdAt=time.time(),
                askerUid=asker,
            )
            try:
                if request.files is not None:
                    await self.workspaces.put(workspace, {f.name: f.content for f in request.files})
                await self.store.save_task(
                    task,
                    EventKind.TASK_STATE,
                    {
                        "state": task.state.value,
                        "title": task.title,
                        "by": caller.name,
                        **({"files": shared} if shared else {}),
                    },
                    new=True,
                )
            except (BoxError, OSError) as error:
                # Not recorded: the shared files' workspace would belong to no task.
                if request.files is not None:
                    await self.workspaces.remove_unrecorded(workspace)
                if isinstance(error, OSError) and is_full(error):
                    die(Problem.FULL, NO_ROOM_TO_START)
                raise
        except Exception as error:
            # Not recorded, for sure: the save failed whole, or never began. A request cancelled
            # mid-save may still have been recorded, so its spare is never handed out again; nor
            # is one whose id turned out to be a recorded task's.
            if spare is not None and not isinstance(error, TaskIdTaken):
                self.spares.give_back(spare)
            raise
        if spare is not None:
            self._made_ahead.add(task_id)
        self.records.export(task)
        await self._start_queued()
        # Another request's admission may have taken this task and still be starting it.
        starting = self._starts.get(task.id)
        if starting is not None:
            await starting.wait()
        if spare is not None:
            self.spares.fill_soon()
        return (await self.records.task(task.id)).public()

    async def get_task(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        """The task and one page of its steps (boxd.manager.pages)."""
        task = await self._task_for(caller, args[0])

        async def fetch(after: int | None, limit: int) -> list[tuple[int, dict[str, Any] | None]]:
            steps = await self.store.events(task.id, EventKind.TASK_STEP, after or 0, limit)
            return [(e.seq, {"seq": e.seq, "at": e.at, **e.data}) for e in steps]

        steps, following = await one_page(fetch, args[1])
        return with_next({**task.public(), "steps": steps}, following)

    async def list_tasks(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        """One page of the tasks the caller may see, newest first."""

        async def fetch(before: int | None, limit: int) -> list[tuple[int, dict[str, Any] | None]]:
            rows = await self.store.task_rows(before, limit)
            return [
                (row, task.public() if task and _may_see(caller, task) else None)
                for row, task in rows
            ]

        tasks, following = await one_page(fetch, args[0])
        return with_next({"tasks": tasks}, following)

    async def _task_for(self, caller: Caller, task_id: str) -> Task:
        """The task, if the caller may see it: an app's token sees only the tasks it started."""
        task = await self.records.task(task_id)
        if not _may_see(caller, task):
            die(Problem.FORBIDDEN, OWNER_ONLY)
        return task

    async def stop_task(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        """The stopped task. On a full disk its worker is stopped at once and its end recorded
        once there is room: the owner is told so with a 507 rather than kept waiting."""
        task = await self._task_for(caller, args[0])
        return await self._unless_waiting_for_room(
            task.id, lambda waiting: self._stop(task.id, waiting), stop_waits_for_room(task.id)
        )

    async def _unless_waiting_for_room(
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
        job = self._in_background(change(waiting))
        await asyncio.wait((job, waiting), return_when=asyncio.FIRST_COMPLETED)
        if job.done():
            return job.result()
        self._ending_on_full[task_id] = words
        job.add_done_callback(lambda _: self._ending_on_full.pop(task_id, None))
        job.add_done_callback(partial(_log_failure, f"the owner's change to task {task_id}"))
        die(Problem.FULL, words)

    async def _stop(self, task_id: str, waiting: "asyncio.Future[None]") -> dict[str, Any]:
        async with self.records.locks[task_id]:
            task = await self.records.task(task_id)
            if task.state.ended:
                die(Problem.INVALID, f"task {task.id} has already ended: it is {task.state}")
            task = await self._end(task, TaskState.FAILED, STOPPED, waiting)
        await self._cleared(task.id)
        return task.public()

    async def undo_task(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        """Takes a task's changes out of its workspace; tasks after it keep theirs. A task still
        running is stopped first. On a full disk, as stop_task."""
        task = await self.records.task(args[0])
        return await self._unless_waiting_for_room(
            task.id,
            lambda waiting: self._undo(caller, task.id, waiting),
            undo_waits_for_room(task.id),
        )

    async def _undo(
        self, caller: Caller, task_id: str, waiting: "asyncio.Future[None]"
    ) -> dict[str, Any]:
        async with self.records.locks[task_id]:
            task = await self.records.task(task_id)
            if task.state == TaskState.UNDONE:
                die(Problem.INVALID, f"task {task.id} is already undone")
            if task.review == Review.KEPT:
                die(
                    Problem.INVALID,
                    f"task {task.id} was kept: its changes are in your folders now, so it "
                    "cannot be undone",
                )
            if not task.state.ended:
                task = await self._end(task, TaskState.FAILED, UNDONE_WHILE_RUNNING, waiting)
            found = await self.store.layer_of(task.id)
            joined = found is not None and found[1]
            update: dict[str, Any] = {"state": TaskState.UNDONE}
            if task.folders:
                update["review"] = Review.UNDONE
            task = task.model_copy(update=update)
            await self.records.record(
                task,
                EventKind.TASK_STATE,
                {"state": "undone", "by": caller.name},
                drop_layer=joined,
            )
        await self._cleared(task.id)
        await self._collect_layers(task.workspace)
        return task.public()

    async def keep_task(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        """Applies a done personal task's changes, deletions included, to the real folders,
        unless a file it changed was changed there too since it started: then nothing is."""
        task = await self.records.task(args[0])
        if not task.folders:
            die(
                Problem.INVALID,
                f"task {task.id} worked on workspace {task.workspace}, not on your folders: "
                "its changes are already in the workspace",
            )
        await self._asker_only(caller, task, "keep")
        async with self.records.locks[task.id]:
            task = await self.records.task(task.id)
            if task.review not in (Review.PENDING, Review.CONFLICT):
                if task.review == Review.KEPT:
                    why = "was already kept"
                elif task.review == Review.UNDONE:
                    why = "was undone"
                elif task.state.ended:
                    why = f"is {task.state}: its changes were not applied"
                else:
                    why = f"is still {task.state}; keep it once it is done"
                die(Problem.INVALID, f"task {task.id} {why}, so there is nothing to keep")
            found = await self.store.layer_of(task.id)
            if found is None or not found[1]:
                die(Problem.FAILED, f"the changes of task {task.id} are no longer on this box")
            async with self._joins[task.workspace]:
                task, data = await self._apply(
                    task, self.layers.store(task.workspace) / layer_name(found[0])
                )
            kept = task.review == Review.KEPT
            await self.records.record(
                task, EventKind.TASK_STATE, {**data, "by": caller.name}, drop_layer=kept
            )
            if "stoppedAt" in data and task.error is not None:
                # Recorded first, so the log and the task's error say what was applied.
                die(Problem.FAILED, task.error)
        await self._collect_layers(task.workspace)
        return task.public()

    async def diff_task(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        """One page of the review of what a task changed (boxd.manager.diffs): its layer against
        the workspace as it saw it, which is what keep replaces when it applies anything (keep
        applies nothing if a path the task changed is no longer as the task saw it). Read
        without the task's lock: a running task may be reviewed as it works."""
        task = await self.records.task(args[0])
        if task.folders:
            await self._asker_only(caller, task, "review")
        head: dict[str, Any] = {
            "id": task.id,
            "workspace": task.workspace,
            "state": task.state.value,
            **({"review": task.review.value} if task.review is not None else {}),
            "against": "saw",
        }
        layer = await self._layer_to_review(task)
        if layer is None:
            return {**head, "truncated": False, "files": []}
        below = []
        for done in task.saw:
            found = await self.store.layer_of(done)
            if found is not None:
                below.append(self.layers.store(task.workspace) / layer_name(found[0]))
        below.append(workspaces_dir(self.home) / task.workspace)
        try:
            page = await asyncio.to_thread(diff_page, layer, below, args[1], bool(task.folders))
        except OSError as error:
            die(
                Problem.FAILED,
                f"the changes of task {task.id} changed while they were read "
                f"({error.strerror or error}); ask again",
            )
        answer = {**head, "truncated": page.truncated, "files": page.files}
        return with_next(answer, page.next)

    async def _asker_only(self, caller: Caller, task: Task, what: str) -> None:
        uid = await asyncio.to_thread(caller_uid, caller)
        asker_only(uid, task.askerUid, task.id, what)

    async def _layer_to_review(self, task: Task) -> Path | None:
        """Where the task's changes are (None: a queued task has made none yet), or why there
        is nothing to review."""
        if task.state == TaskState.QUEUED:
            return None
        if task.state in (TaskState.RUNNING, TaskState.WAITING):
            return self.layers.upper(task.id)
        found = await self.store.layer_of(task.id)
        if task.state == TaskState.DONE and found is not None and found[1]:
            return self.layers.store(task.workspace) / layer_name(found[0])
        if task.review == Review.KEPT:
            why = "was kept: its changes are in your folders now"
        elif task.state == TaskState.UNDONE:
            why = "was undone: its changes are gone"
        elif task.state == TaskState.FAILED:
            why = "failed: its changes were thrown away"
        else:
            why = f"is {task.state}: its changes are no longer on this box"
        die(Problem.INVALID, f"task {task.id} {why}, so there is nothing to review")

    async def _apply(self, task: Task, layer: Path) -> tuple[Task, dict[str, Any]]:
        assert task.folders is not None
        folders = real_folders(task.folders)
        for folder in folders:
            try:
                still = await asyncio.to_thread(folder.path.resolve, True)
            except OSError:
                still = None
            if still != folder.path:
                die(
                    Problem.INVALID,
                    f"folder {folder.path} is gone or has become a link since task {task.id} "
                    "started; nothing was applied",
                )
        places = Places(folders)
        manifest = task_manifest(self.home, task.id)
        changes = await asyncio.to_thread(layer_changes, layer)
        saw = await asyncio.to_thread(load_manifest, manifest)
        try:
            # Kept by root alone when the record has no asker: as each folder's owner, then.
            asker = task.askerUid if task.askerUid is not None else 0
            outcome = await as_owner_work(keep, changes, saw, layer, places, asker)
        except KeepError as refused:
            die(Problem.INVALID, str(refused))
        state = {"state": task.state.value}
        clash = outcome.conflicts
        if clash:
            shown = ", ".join(clash[:20]) + (
                f" and {len(clash) - 20} more" if len(clash) > 20 else ""
            )
            error = (
                f"Nothing was applied: these files changed in your folders since the task "
                f"started: {shown}. Undo the task, or change them back and keep it again."
            )
            task = task.model_copy(update={"review": Review.CONFLICT, "error": error})
            return task, {**state, "review": "conflict", "conflicts": clash}
        if outcome.stopped_at is not None:
            error = outcome.stopped_words()
            task = task.model_copy(update={"review": Review.PENDING, "error": error})
            return task, {
                **state,
                "review": "pending",
                "applied": len(outcome.applied),
                # The first thousand of each: one event stays a size a log can hold.
                "appliedPaths": outcome.applied[:1000],
                "notApplied": outcome.not_applied[:1000],
                "stoppedAt": outcome.stopped_at,
                "why": outcome.why,
                "error": error,
            }
        task = task.model_copy(update={"review": Review.KEPT, "error": None})
        return task, {**state, "review": "kept", "applied": len(outcome.applied)}

    async def _collect_layers(self, workspace: str) -> None:
        """Deletes the files of layers that left the stack (undone, kept), once no unfinished
        task stacks them: a running task's view must not change under it."""
        unfinished = (TaskState.QUEUED, TaskState.RUNNING, TaskState.WAITING)
        async with self._joins[workspace]:
            dropped = await self.store.dropped_layers(workspace)
            if not dropped:
                return
            needed = {done for t in await self.store.tasks(unfinished) for done in t.saw}
            needed.update(done for saw in self._starting.values() for done in saw)
            for number, task_id in dropped:
                if task_id not in needed:
                    await self.layers.remove(workspace, layer_name(number))
                    # Its files are gone with its layer: nothing of its user's is left.
                    await self._remove_user(task_id)

    async def get_settings(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        return (await self.store.settings()).model_dump(mode="json")

    async def set_settings(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        changes = loads(args[0], "the settings")
        if not isinstance(changes, dict):
            die(Problem.INVALID, "the settings must be a JSON object of names and values")
        current = await self.store.settings()
        settings = change_settings(current, changes)
        if settings.taskDiskQuotaBytes not in (None, current.taskDiskQuotaBytes):
            why = await asyncio.to_thread(disk_quota.why_not, self.home)
            if why is not None:
                die(Problem.INVALID, disk_quota.refused(self.home, why))
        await self._limit_all_tasks(settings)
        await self.store.save_settings(settings)
        # A higher maxRunningTasks lets queued tasks start now.
        self._start_queued_soon()
        self._in_background(self._renew_stale_spares(settings))
        return settings.model_dump(mode="json")

    async def _limit_all_tasks(self, settings: Settings) -> None:
        try:
            await self.systemd.set_properties(ALL_TASKS_SLICE, all_tasks_properties(settings))
        except SystemdError as error:
            die(
                Problem.FAILED,
                f"could not set the limits of all tasks together on {ALL_TASKS_SLICE}: {error}",
            )

    async def get_droid(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        return self.droid.state.public()

    async def create_token(self, caller: Caller, args: list[Any]) -> str:
        role = token_role(args[1])
        name = check_member_id(args[0]) if role == Role.MEMBER else check_token_name(args[0])
        limits = self._check_limits(role, args[2])
        token = new_token()
        stored = None if limits is None else limits.model_dump_json()
        await self.store.add_token(token_hash(token), name, role.value, caller.user, stored)
        return token

    def _check_limits(self, role: Role, text: str) -> TokenLimits | None:
        """An app's or a member's limits as sent, each of them one a task could have here now;
        an owner's token has none: it acts as the owner."""
        limits = parse_limits(text)
        if role == Role.OWNER:
            if limits.model_fields_set:
                die(
                    Problem.INVALID,
                    "an owner's token acts as the owner, so it has no limits: limits are for "
                    "an app's or a member's token (--app, --member)",
                )
            return None
        for tool in limits.tools:
            self._installed(tool)
        for workspace in limits.workspaces:
            if workspace.startswith((SHARED, PERSONAL)):
                die(
                    Problem.INVALID,
                    f"workspace {workspace} is one the box made for one task's files or the "
                    "owner's own folders: only the owner may start tasks on it",
                )
            if not self.workspaces.exists(workspace):
                die(Problem.INVALID, f"no workspace {workspace}")
        return limits

    def _installed(self, tool: str) -> None:
        """A 400 unless the tool's app is installed. By its app: which tools an app has only its
        runner knows, and root runs no app's code; a tool its app lacks is refused when a task
        calls it."""
        app, dot, verb = tool.partition(".")
        if not (dot and verb and app in self.apps.installed):
            die(Problem.INVALID, f"no tool {tool}: it is not installed on this box")

    async def list_tokens(self, caller: Caller, args: list[str]) -> list[dict[str, Any]]:
        return [token.public() for token in await self.store.tokens()]

    async def revoke_token(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        """Removes a token: its next call is refused (401), whatever it was doing."""
        token = find_token(await self.store.tokens(), args[0])
        await self.store.remove_token(token.hash)
        return token.public()

    async def create_pairing(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        device = check_device_name(args[0])
        code = self.pairings.make(device, caller.user)
        return {"device": device, "code": code, "expiresInSeconds": int(LIFETIME)}

    async def pair(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        """A device's token, for a good code: stored as the device's, shown once, here."""
        paired = self.pairings.redeem(args[0])
        token = new_token()
        await self.store.add_token(token_hash(token), paired.device, DEVICE, paired.maker)
        log.info("device %s is paired", paired.device)
        return {"device": paired.device, "token": token}

    async def get_agents(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        return {"paused": await self.store.agents_paused()}

    async def pause_agents(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        """New tasks stay queued from now on, across restarts; running ones carry on (README:
        Pausing the agents). Under the admission lock, so no task is admitted after this
        answers."""
        async with self._admission:
            await self.store.save_agents_paused(True)
        log.info("the agents are paused by %s", caller.name)
        return {"paused": True}

    async def resume_agents(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        """The queued tasks start in the order they came, as places are free."""
        async with self._admission:
            await self.store.save_agents_paused(False)
        log.info("the agents are resumed by %s", caller.name)
        self._start_queued_soon()
        return {"paused": False}

    async def list_workspaces(self, caller: Caller, args: list[str]) -> list[dict[str, Any]]:
        return [self.workspaces.describe(name) for name in self.workspaces.names()]

    async def create_workspace(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        return await self.workspaces.create(args[0])

    async def remove_workspace(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        name = args[0]
        unfinished = (TaskState.QUEUED, TaskState.RUNNING, TaskState.WAITING)
        busy = [t.id for t in await self.store.tasks(unfinished) if t.workspace == name]
        self.workspaces.check_removable(name, busy)
        async with self._joins[name]:
            await self.store.drop_workspace_layers(name)
            return await self.workspaces.move_to_trash(name, self.layers.store(name))

    # The task's life.

    async def _admit(self) -> list[Task]:
        """Gives the free places to the oldest queued tasks; returns them, oldest first, after
        the Droid tasks that cannot run, which _start fails. Droid tasks wait for its install
        without a place, and every task waits while the agents are paused."""
        async with self._admission:
            limit = (await self.store.settings()).maxRunningTasks
            queued = await self.store.tasks((TaskState.QUEUED,))
            paused = await self.store.agents_paused()
            may_start, refused = sort_queue(queued, self.droid.state, paused)
            chosen = next_to_start(may_start, self._places, limit)
            refused = [task for task in refused if task.id not in self._places]
            self._places.update(task.id for task in (*refused, *chosen))
            for task in (*refused, *chosen):
                self._starts.setdefault(task.id, asyncio.Event())
            return [*refused, *chosen]

    async def _start_queued(self) -> None:
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

    def _start_queued_soon(self) -> None:
        self._in_background(self._start_queued())

    async def _start(self, task: Task) -> Task:
        """Starts a queued task that has been given a place."""
        async with self.records.locks[task.id]:
            current = await self.store.task(task.id)
            if current is None or current.state != TaskState.QUEUED:
                # Stopped while it waited for its place.
                self._places.discard(task.id)
                return current or task
            task = current
            if task.worker == Worker.DROID:
                refusal = self.droid.state.task_error or await self._droid_key_missing()
                if refusal is not None:
                    return await self._end(task, TaskState.FAILED, refusal)
            failure: str | None = None
            async with self._joins[task.workspace]:
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
                    return await self._end(task, TaskState.FAILED, failure)
                try:
                    await self._start_units(task)
                # ValueError: a worker boxd has no command for (worker_unit.worker_command).
                except (BoxError, SystemdError, OSError, ValueError) as error:
                    return await self._end(
                        task, TaskState.FAILED, f"The task could not start: {_words(error)}"
                    )
                task = task.model_copy(update={"state": TaskState.RUNNING})
                await self.records.record(task, EventKind.TASK_STATE, {"state": "running"})
            finally:
                self._starting.pop(task.id, None)
            return task

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
        directory = self._task_directory(task.id)
        uid = await task_uid(
            user, partial(self.store.claim_uid, task.id, FIRST_UID, LAST_UID, id_taken)
        )
        # A spare's user and namespace were made ahead, in this run (spares.py).
        made_ahead = task.id in self._made_ahead
        self._made_ahead.discard(task.id)
        quota = (await self.store.settings()).taskDiskQuotaBytes
        if quota is not None:
            await self._limit_disk(task.id, uid, quota)
        await at_once(
            ensure_user(user, directory, uid),
            task_home.prepare(self.home, task.id, uid, project=quota is not None),
            self.layers.mount(task.id, task.workspace, layers, uid, project=quota is not None),
            *([] if made_ahead else [netns.ensure(task.id)]),
        )
        manifest = task_manifest(self.home, task.id)
        if task.folders and not manifest.exists():
            seen = await asyncio.to_thread(take_manifest, task_work_dir(self.home, task.id))
            await asyncio.to_thread(save_manifest, seen, manifest)

    async def _limit_disk(self, task_id: str, uid: int, quota: int) -> None:
        """The most the task's home and changes may take of the disk together (its project
        is its uid: boxd.manager.disk_quota)."""
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
        unit = worker_unit(task.id)
        settings = await self.store.settings()
        # The vault holds still from the count's check to the worker's start: a secret removed
        # once the owner was told so never reaches this task through a broker started before.
        async with self.vault.unchanged() as changes:
            ahead = self._ahead.pop(task.id, None)
            if ahead is not None and not ahead.broker_holds(changes, self.systemd.reloads):
                # A spare's broker holds the secrets and the unit of when it started: the vault
                # changed since, or systemd reloaded its units (a drop-in's Environment=, say), so
                # it goes, and its socket starts a new one on the worker's first connection.
                await self.systemd.stop_unit(broker_service_unit(task.id))
            if ahead is not None and await self._wake_ahead(task, ahead, settings):
                return
            self.systemd.watch(unit, partial(self._check_soon, task.id))
            await self.systemd.start_transient(unit, worker_properties(self.home, task, settings))

    async def _wake_ahead(self, task: Task, ahead: Ahead, settings: Settings) -> bool:
        """Makes the spare's worker started ahead this task's worker, if it still can be (see
        _why_not_woken). Otherwise it goes, and False says to start one."""
        unit = worker_unit(task.id)
        why = await self._why_not_woken(task, ahead, settings)
        if why is None:
            self.systemd.watch(unit, partial(self._check_soon, task.id))
            try:
                await self.systemd.signal_main(unit, wake_signal(task))
                return True
            except SystemdError as failure:
                why = str(failure)
        log.info("task %s: starting a new worker, not the one started ahead: %s", task.id, why)
        # No longer the spare's to watch, nor yet the task's: its stop is nobody's news.
        self.systemd.unwatch(unit)
        await self._let_go(unit)
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

    def _check_soon(self, task_id: str) -> None:
        self._in_background(self._check(task_id))

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
                    await self._end(task, TaskState.FAILED, VANISHED)
                    return
                if not status.finished:
                    return
                if status.succeeded:
                    await self._end(task, TaskState.DONE, None)
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
                    if await asyncio.to_thread(disk_full, self.home):
                        error = full_words(error)
                    await self._end(task, TaskState.FAILED, error)
        except Exception:
            log.exception("could not follow the worker of task %s", task_id)

    async def _end(
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
        await self._let_go(unit)
        recorded = full = False
        try:
            await self.layers.unmount(task.id)
            # On a full disk the task's files go before its end is recorded rather than after:
            # the record needs room, and they may hold all there is (its home is its own user's
            # to fill, all of a file system with no root reserve). Its home goes however it
            # ends; changes thrown away, with a mark that keeps it from resuming (throw_away).
            full = await asyncio.to_thread(disk_full, self.home)
            if full:
                await task_home.remove(self.home, task.id)
            if state == TaskState.DONE:
                async with self._joins[task.workspace]:
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
        await self._clear_ended(task)
        await self._collect_layers(task.workspace)
        # The layer it left or threw away may have given back the space boxd keeps in reserve.
        await self.store.keep_reserve()
        self._places.discard(task.id)
        self._start_queued_soon()
        return task

    async def _clear_ended(self, task: Task) -> None:
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
            await self._let_go(name)
        if task.id not in self._leaving:
            job = self._in_background(self._leave(task))
            self._leaving[task.id] = job
            job.add_done_callback(lambda _: self._leaving.pop(task.id, None))

    async def _leave(self, task: Task) -> None:
        """The end of clearing an ended task: its broker's units stopped, its home gone, a
        failed task's user gone, and last its network namespace, so a namespace left says this
        was cut off. Runs beside the task's lock, never under it: a broker told to stop first
        lets its running tools record their results (FinishCall), which takes that lock."""
        self._ahead.pop(task.id, None)
        try:
            for name in broker_units(task.id):
                await self._let_go(name)
            # A broker that could not say how its model replies ended (killed) left them open.
            await self.model_requests.settle_gone(task.id)
            await task_home.remove(self.home, task.id)
            if task.state != TaskState.DONE:
                # Its worker is stopped and its layer thrown away: its user owns nothing now.
                await self._remove_user(task.id)
            try:
                await netns.remove(task.id)
            except BoxError as failure:
                log.warning("%s", failure.message)
        except Exception:
            log.exception("could not clear up what task %s left", task.id)

    async def _cleared(self, task_id: str) -> None:
        """Returns once an ended task is cleared up; called after letting go of its lock."""
        job = self._leaving.get(task_id)
        if job is not None:
            await asyncio.shield(job)

    async def _cut_off_ends(self) -> list[Task]:
        """Ended tasks whose clearing up the manager did not finish: a network namespace, a
        home or an approval still pending is left."""
        named = set(await asyncio.to_thread(netns.task_ids))
        named |= {a.task for a in await self.store.approvals(ApprovalState.PENDING)}
        homes = self.home / "tasks"
        named |= {
            path.parent.name for path in await asyncio.to_thread(lambda: list(homes.glob("*/home")))
        }
        found = [await self.store.task(task_id) for task_id in sorted(named)]
        return [task for task in found if task is not None and task.state.ended]

    def _free_disk_soon(self) -> None:
        self._in_background(self._free_disk())

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
                await self._end(task, TaskState.FAILED, stopped_words(used // MIB))
        except Exception:
            log.exception("could not free the disk")

    async def _remove_user(self, task_id: str) -> None:
        failed = await remove_user(task_user(task_id))
        if failed:
            log.warning("%s", failed)

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
            lambda: self.records.record(task, EventKind.TASK_STATE, data, layer=layer),
            waiting,
        )
        return task

    async def _let_go(self, unit: str) -> None:
        try:
            await self.systemd.stop_unit(unit)
            await self.systemd.reset_failed(unit)
        except SystemdError as failure:
            log.warning("could not clean up %s: %s", unit, failure)


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


def allowed_for(caller: Caller, request: TaskRequest, settings: Settings) -> tuple[int, list[str]]:
    """The new task's budget and hosts: what it asked for, else the box's defaults; for any
    caller but the owner (an app's or a member's token), within the limits its token was made
    with, and never on the workspace of another task's shared files (a 403 that says which)."""
    allowlist = settings.networkDefault == NetworkDefault.ALLOWLIST
    default_hosts = list(settings.defaultHosts) if allowlist else []
    if caller.acts_as_owner:
        budget = request.budgetCents
        return (
            settings.defaultBudgetCents if budget is None else budget,
            default_hosts if request.hosts is None else request.hosts,
        )
    if request.files is None and request.workspace.startswith(SHARED):
        die(
            Problem.FORBIDDEN,
            f"workspace {request.workspace} holds the files shared to task "
            f"{request.workspace.removeprefix(SHARED)}: only the owner may start another task "
            "on it",
        )
    return check_task(
        caller.limits or DEFAULT,
        holder(caller.role),
        request,
        default_budget=settings.defaultBudgetCents,
        default_hosts=default_hosts,
    )


def _owner_only(caller: Caller) -> None:
    if not caller.acts_as_owner:
        die(Problem.FORBIDDEN, OWNER_ONLY)


def _source(caller: Caller, asked: str) -> str:
    """A paired device's tasks are always phone:<its name>; no one else may say phone:."""
    if caller.device is not None:
        return f"{PHONE}{caller.device}"
    if asked.lower().startswith(PHONE):
        die(
            Problem.INVALID,
            f"source {asked} is refused: phone:<device name> is set by the box for tasks from "
            "a paired device (boxctl pair NAME pairs one); send another source, such as api",
        )
    return asked


def _may_see(caller: Caller, task: Task) -> bool:
    if caller.role == Role.MEMBER:
        return task.requester == caller.name
    return caller.acts_as_owner or (caller.role == Role.APP and task.app == caller.name)


def _words(error: Exception) -> str:
    return error.message if isinstance(error, BoxError) else str(error)
