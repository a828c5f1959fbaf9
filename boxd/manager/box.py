"""The manager's wiring, and the methods on tasks themselves. Box makes its parts and joins them:
lifecycle (admission and start) and ending (following, ending, clearing up), spares, review
(undo, keep, diff), owner_methods (settings, tokens, pairing, pausing, workspaces), and the
methods brokers call (broker_methods, model_requests) and the owner's answers (approval_answers).
It opens them, picks up tasks at start-up, and routes each D-Bus method to its handler; it
creates, shows, lists and stops tasks itself. Every change is recorded through Records, under
the task's lock."""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from dbus_fast.aio import MessageBus

from boxd.dbus import interface as api
from boxd.dbus.server import Handler
from boxd.errors import NO_ROOM_TO_START, BoxError, Problem, die, is_full
from boxd.manager.access.screen_sessions import ScreenSessions
from boxd.manager.access.vault import Vault
from boxd.manager.app_runners import AppRunners
from boxd.manager.approval_answers import ApprovalAnswers
from boxd.manager.background import Background
from boxd.manager.broker_methods import BrokerMethods
from boxd.manager.doctor.checks import on_this_machine, run_checks
from boxd.manager.doctor.gate import Doctor
from boxd.manager.folders.folders import asking_account, check_folders, folder_workspace, look_as
from boxd.manager.folders.owner_process import as_owner_work
from boxd.manager.lifecycle import Lifecycle
from boxd.manager.machinery import Machinery
from boxd.manager.model_requests import ModelRequests
from boxd.manager.owner_changes import OwnerChanges
from boxd.manager.owner_methods import OwnerMethods
from boxd.manager.pages import one_page, with_next
from boxd.manager.record.damaged import DAMAGED
from boxd.manager.record.ledger import TaskIdTaken, TaskSave
from boxd.manager.record.records import Records
from boxd.manager.record.store import Store
from boxd.manager.review import ReviewMethods
from boxd.manager.spares import SpareMaker
from boxd.manager.units import at_rest
from boxd.manager.units.systemd import Systemd
from boxd.manager.units.task_os import TaskOS
from boxd.manager.view_mounts import ViewMounts
from boxd.manager.workspace_archive import WorkspaceArchives
from boxd.manager.workspace_files import WorkspaceFiles
from boxd.manager.workspaces.layers import Layers
from boxd.manager.workspaces.workspaces import PERSONAL, SHARED, Workspaces
from boxd.wire.caller import OWNER_ONLY, Caller, Role
from boxd.wire.claude_models import DEFAULT_MODEL, resolve_model
from boxd.wire.doctor import Finding
from boxd.wire.doctor import public as doctor_answer
from boxd.wire.event import EventKind
from boxd.wire.ids import new_task_id, task_user
from boxd.wire.model_key import KEY_REFUSED
from boxd.wire.models.settings import NetworkDefault, Settings
from boxd.wire.models.task import Task, TaskState
from boxd.wire.models.task_request import AGENTS, TaskRequest, parse_task_request
from boxd.wire.models.token_limits import DEFAULT, check_task, holder

PHONE = "phone:"
log = logging.getLogger(__name__)


STOPPED = "Stopped by its owner."


def stop_waits_for_room(task_id: str) -> str:
    """What the owner is told of a stop whose end cannot be recorded on a full disk, at once,
    rather than nothing until the stop call times out."""
    return (
        f"Task {task_id} is stopped: its worker no longer runs. The box's disk is full, so its "
        "end is recorded once there is room (free space by undoing tasks or removing "
        "workspaces); until then it still shows as running."
    )


class Box:
    def __init__(
        self,
        home: Path,
        store: Store,
        bus: MessageBus,
        systemd: Systemd,
        task_os: TaskOS | None = None,
        check_machine: Callable[[], Awaitable[list[Finding]]] | None = None,
    ) -> None:
        self.home = home
        self.task_os = task_os or TaskOS()
        self.store = store
        self.bus = bus
        self.systemd = systemd
        self.vault = Vault(home)
        self.apps = AppRunners(systemd, self.vault, home)
        self.vault.changed = self.apps.secrets_changed
        self.workspaces = Workspaces(home)
        self.layers = Layers(home)
        self.records = Records(store, bus)
        self.approvals = ApprovalAnswers(self.records)
        self.broker = BrokerMethods(self.records)
        self.model_requests = ModelRequests(self.records)
        self.background = Background()
        self.screen = ScreenSessions(store)
        self.views = ViewMounts(store, self.layers)
        # What this machine lacks stops every task from starting (boxd.manager.doctor.gate).
        self.doctor = Doctor(
            check_machine or partial(run_checks, on_this_machine(home, bus, systemd)),
            self._machine_fixed,
        )
        machinery = Machinery(
            home,
            store,
            systemd,
            self.layers,
            self.task_os,
            self.background,
            self.views,
            self.doctor,
        )
        self.spare_maker = SpareMaker(machinery, self.vault)
        self.spares = self.spare_maker.pool
        self.lifecycle = Lifecycle(
            machinery,
            self.records,
            self.approvals,
            self.model_requests,
            self.vault,
            self.spare_maker,
        )
        self.droid = self.lifecycle.droid
        self.ending = self.lifecycle.ending
        self.owner = OwnerMethods(
            home,
            store,
            systemd,
            self.apps,
            self.workspaces,
            self.layers,
            self.lifecycle,
            self.spare_maker,
            self.background,
        )
        self.review = ReviewMethods(home, store, self.records, self.layers, self.ending)
        self.archives = WorkspaceArchives(store, self.layers, self.workspaces)
        self.files = WorkspaceFiles(store, self.layers, self.workspaces)
        self.changes = OwnerChanges(
            store, self.records, self.layers, self.workspaces, views=self.views
        )

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
        await self.owner.limit_all_tasks(await self.store.settings())
        self.store.on_full = self.ending.free_disk_soon
        for task in await self.store.tasks():
            self.spare_maker.known_at_open.add(task.id)
            self.records.export(task)
            if task.state in (TaskState.RUNNING, TaskState.WAITING):
                self.lifecycle.take_place(task.id)
        for task_id, state in await self.store.damaged_tasks():
            await self._fail_damaged(task_id, state)
        # After the record is read: /run is a tmpfs, so after a reboot the views are made again
        # from the stacks it holds.
        await self.views.open(await asyncio.to_thread(self.workspaces.names))

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
                    await self.ending.end(task, TaskState.FAILED, DAMAGED)
                else:
                    await self.records.record(
                        TaskSave(task, EventKind.TASK_STATE, {"state": "failed", "error": DAMAGED})
                    )
        except Exception:
            log.exception("could not record damaged task %s as failed", task_id)

    async def recover(self) -> None:
        """Picks up tasks that were running when boxd stopped (Lifecycle.recover). Then queued
        tasks start, oldest first, as places are free."""
        await self.lifecycle.recover()
        await self.model_requests.settle_all_gone()
        await self.droid.begin()
        await self.lifecycle.start_queued()
        self.background(self.spare_maker.renew_leftovers())

    def _machine_fixed(self) -> None:
        """The checks pass (again): queued tasks start, and spares are made."""
        self.lifecycle.start_queued_soon()
        self.spares.fill_soon()

    async def check_machine(self, caller: Caller) -> dict[str, Any]:
        """The machine checked anew (boxctl doctor, GET /api/doctor)."""
        findings = await self.doctor.check_again()
        return doctor_answer(findings, age=self.doctor.age())

    def routes(self) -> dict[api.Method, Handler]:
        return {
            api.CREATE_TASK: self.create_task,
            api.GET_TASK: self.get_task,
            api.LIST_TASKS: self.list_tasks,
            api.STOP_TASK: self.stop_task,
            api.UNDO_TASK: self.review.undo_task,
            api.KEEP_TASK: self.review.keep_task,
            api.DIFF_TASK: self.review.diff_task,
            api.LIST_WORKSPACE_FILES: self.files.list_workspace_files,
            api.GET_WORKSPACE_FILE_HISTORY: self.files.get_workspace_file_history,
            api.OPEN_WORKSPACE_FILE: self.files.open_workspace_file,
            api.LIST_APPROVALS: self.approvals.list_approvals,
            api.ANSWER_APPROVAL: self.approvals.answer_approval,
            api.LIST_WORKSPACES: self.owner.list_workspaces,
            api.CREATE_WORKSPACE: self.owner.create_workspace,
            api.REMOVE_WORKSPACE: self.owner.remove_workspace,
            api.ADD_TO_WORKSPACE: self.changes.add_to_workspace,
            api.DELETE_FROM_WORKSPACE: self.changes.delete_from_workspace,
            api.RENAME_IN_WORKSPACE: self.changes.rename_in_workspace,
            api.OPEN_WORKSPACE_ARCHIVE: self.archives.open_workspace_archive,
            api.GET_SETTINGS: self.owner.get_settings,
            api.SET_SETTINGS: self.owner.set_settings,
            api.CREATE_TOKEN: self.owner.create_token,
            api.LIST_TOKENS: self.owner.list_tokens,
            api.REVOKE_TOKEN: self.owner.revoke_token,
            api.GET_DROID: self.owner.get_droid,
            api.GET_CLAUDE: self.owner.get_claude,
            api.CHECK_MACHINE: self.check_machine,
            api.CREATE_PAIRING: self.owner.create_pairing,
            api.PAIR: self.owner.pair,
            api.GET_AGENTS: self.owner.get_agents,
            api.PAUSE_AGENTS: self.owner.pause_agents,
            api.RESUME_AGENTS: self.owner.resume_agents,
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

    async def model_key_refused(self, caller: Caller, task_id: str) -> dict[str, Any]:
        """The task's model gateway found the vault's key refused upstream (401): the task
        ends failed, saying so. Ended in the background, since ending it stops the broker that
        is waiting for this answer; queued on the task's lock now, before the broker passes the
        401 to the worker, so the worker's exit that follows does not end it in other words."""
        task = await self.records.task(task_id)
        if not task.state.ended:
            self.background(self.ending.end_by_broker(task.id, KEY_REFUSED))
        return task.public()

    # The tasks' own methods.

    async def create_task(self, caller: Caller, request: str) -> dict[str, Any]:
        asked = parse_task_request(request)
        await self.doctor.refuse_if_failing(to_owner=caller.acts_as_owner)
        settings = await self.store.settings()
        personal = asked.personal
        if personal is not None or asked.workspace.startswith(PERSONAL):
            _owner_only(caller)
        if personal is None and asked.workspace.startswith(PERSONAL):
            die(
                Problem.INVALID,
                f"workspace {asked.workspace} is the copy of your personal folders: start the "
                "task with folder or folders instead",
            )
        # Before a workspace or tool is looked up: a limited token learns nothing of the others.
        budget, hosts = allowed_for(caller, asked, settings)
        if personal is None and asked.files is None and not self.workspaces.exists(asked.workspace):
            die(Problem.INVALID, f"no workspace {asked.workspace}")
        for tool in asked.tools:
            self.owner.installed(tool)
        agent = asked.worker in AGENTS
        workspace = asked.workspace
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
        if await asyncio.to_thread(self.task_os.disk_full, self.home):
            die(Problem.FULL, NO_ROOM_TO_START)
        # A spare id comes with its user and network namespace made (spares.py).
        spare = self.spares.take()
        task_id = spare or new_task_id()
        try:
            shared: list[dict[str, Any]] = []
            if asked.files is not None:
                # Shared files make a workspace of their own; the log keeps names and sizes only.
                workspace = f"files-{task_id}"
                await self.workspaces.create(workspace, files=True)
                # Before the files, which then inherit the owner's read access.
                await self.views.open_base(workspace)
                shared = [{"name": f.name, "size": len(f.content)} for f in asked.files]
            task = Task(
                id=task_id,
                title=asked.title,
                prompt=asked.prompt,
                state=TaskState.QUEUED,
                user=task_user(task_id),
                workspace=workspace,
                worker=asked.worker,
                tools=list(asked.tools),
                hosts=hosts,
                source=_source(caller, asked.source),
                model=asked.model or (resolve_model(DEFAULT_MODEL) if agent else None),
                budgetCents=budget,
                seat=asked.seat,
                droid=asked.droid if agent else None,
                folder=folders[0] if folders else None,
                folders=folders,
                app=caller.name if caller.role == Role.APP else None,
                requester=caller.name if caller.role == Role.MEMBER else None,
                createdAt=time.time(),
                askerUid=asker,
            )
            try:
                if asked.files is not None:
                    await self.workspaces.put(workspace, {f.name: f.content for f in asked.files})
                    await self.views.remake(workspace)
                await self.store.save_task(
                    TaskSave(
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
                )
            except (BoxError, OSError) as error:
                # Not recorded: the shared files' workspace would belong to no task.
                if asked.files is not None:
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
            self.spare_maker.taken(task_id)
        self.records.export(task)
        await self.lifecycle.start_queued()
        # Another request's admission may have taken this task and still be starting it.
        await self.lifecycle.until_started(task.id)
        if spare is not None:
            self.spares.fill_soon()
        return (await self.records.task(task.id)).public()

    async def get_task(self, caller: Caller, task_id: str, page: str) -> dict[str, Any]:
        """The task and one page of its steps (boxd.manager.pages)."""
        task = await self._task_for(caller, task_id)

        async def fetch(after: int | None, limit: int) -> list[tuple[int, dict[str, Any] | None]]:
            steps = await self.store.events(task.id, EventKind.TASK_STEP, after or 0, limit)
            return [(e.seq, {"seq": e.seq, "at": e.at, **e.data}) for e in steps]

        steps, following = await one_page(fetch, page)
        return with_next({**task.public(), "steps": steps}, following)

    async def list_tasks(self, caller: Caller, page: str) -> dict[str, Any]:
        """One page of the tasks the caller may see, newest first."""

        async def fetch(before: int | None, limit: int) -> list[tuple[int, dict[str, Any] | None]]:
            rows = await self.store.task_rows(before, limit)
            return [
                (row, task.public() if task and _may_see(caller, task) else None)
                for row, task in rows
            ]

        tasks, following = await one_page(fetch, page)
        return with_next({"tasks": tasks}, following)

    async def _task_for(self, caller: Caller, task_id: str) -> Task:
        """The task, if the caller may see it: an app's token sees only the tasks it started."""
        task = await self.records.task(task_id)
        if not _may_see(caller, task):
            die(Problem.FORBIDDEN, OWNER_ONLY)
        return task

    async def stop_task(self, caller: Caller, task_id: str) -> dict[str, Any]:
        """The stopped task. On a full disk its worker is stopped at once and its end recorded
        once there is room: the owner is told so with a 507 rather than kept waiting."""
        task = await self._task_for(caller, task_id)
        return await self.ending.unless_waiting_for_room(
            task.id, lambda waiting: self._stop(task.id, waiting), stop_waits_for_room(task.id)
        )

    async def _stop(self, task_id: str, waiting: "asyncio.Future[None]") -> dict[str, Any]:
        async with self.records.locks[task_id]:
            task = await self.records.task(task_id)
            if task.state.ended:
                die(Problem.INVALID, f"task {task.id} has already ended: it is {task.state}")
            task = await self.ending.end(task, TaskState.FAILED, STOPPED, waiting)
        await self.ending.cleared(task.id)
        return task.public()


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
