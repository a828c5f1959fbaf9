"""The box: the life of tasks. It creates them, starts their users, views and units, follows the
units, ends them, undoes and keeps them. Every change is recorded through Records, under the
task's lock; what brokers ask is in broker_methods, the owner's answers in approval_answers."""

import asyncio
import grp
import json
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from dbus_fast.aio import MessageBus

from boxd.approval import TASK_ENDED, ApprovalState
from boxd.apps.registry import find_tool
from boxd.caller import Caller, Role
from boxd.claude_models import DEFAULT_MODEL, resolve_model
from boxd.dbus import interface as api
from boxd.errors import BoxError, Problem, die
from boxd.event import EventKind
from boxd.ids import new_task_id, task_user
from boxd.manager import at_rest, netns, task_home
from boxd.manager.approval_answers import ApprovalAnswers
from boxd.manager.broker_methods import BrokerMethods
from boxd.manager.exit_words import why_failed
from boxd.manager.folders import check_folders, folder_workspace, owner_home, real_folders
from boxd.manager.keep import (
    Places,
    UnsafePath,
    apply,
    conflicts,
    layer_changes,
    load_manifest,
    save_manifest,
    take_manifest,
)
from boxd.manager.last_words import last_words
from boxd.manager.layers import MAX_DONE, Layers, layer_name
from boxd.manager.mirror import sync_mirror
from boxd.manager.records import Records
from boxd.manager.store import Store
from boxd.manager.systemd import Systemd, SystemdError
from boxd.manager.tokens import check_token_name, new_token, token_hash
from boxd.manager.users import ensure_user
from boxd.manager.vault import Vault
from boxd.manager.worker_unit import (
    WORK_GROUP,
    broker_service_unit,
    broker_socket_unit,
    egress_socket_units,
    worker_properties,
    worker_unit,
)
from boxd.manager.workspaces import PERSONAL, Workspaces
from boxd.paths import task_dir, task_manifest, task_work_dir, workspaces_dir
from boxd.settings import NetworkDefault, change_settings
from boxd.task import Review, Task, TaskState
from boxd.task_request import Worker, parse_task_request

log = logging.getLogger(__name__)

DROID_MISSING = (
    "This box cannot run Droid tasks yet: the Droid worker is not installed here. "
    "Start the task with worker fake, or wait for the Droid worker."
)
STOPPED = "Stopped by its owner."
OWNER_ONLY = "only this computer's own screen or the owner's paired device can do this"
UNDONE_WHILE_RUNNING = "Stopped by its owner, to undo it."


def _full(workspace: str) -> str:
    return (
        f"Workspace {workspace} already holds {MAX_DONE} finished tasks, the most it can "
        "stack: undo some of them, or start the task on another workspace."
    )


class Box:
    def __init__(self, home: Path, store: Store, bus: MessageBus, systemd: Systemd) -> None:
        self.home = home
        self.store = store
        self.bus = bus
        self.systemd = systemd
        self.vault = Vault(home)
        self.workspaces = Workspaces(home)
        self.layers = Layers(home)
        # One lock per workspace: its mirror, its stack and the mounts made from it change
        # under it, so no layer is taken away while a task is mounting it.
        self._joins: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # The `saw` of tasks between reading their stack and recording it, by task id.
        self._starting: dict[str, list[str]] = {}
        self.records = Records(store, bus)
        self.approvals = ApprovalAnswers(self.records)
        self.broker = BrokerMethods(self.records)
        self._background: set[asyncio.Task[None]] = set()

    # Start-up and recovery.

    async def open(self) -> None:
        (self.home / "tasks").mkdir(parents=True, exist_ok=True)
        at_rest.restrict(self.home, at_rest.BOX_HOME)
        at_rest.restrict(self.home / "tasks", at_rest.TASKS)
        self.workspaces.open()
        self.layers.open()
        self.vault.open()
        await self.systemd.subscribe()
        for task in await self.store.tasks():
            self.records.export(task)

    async def recover(self) -> None:
        """Picks up tasks that were running when boxd stopped. systemd kept their units; a worker
        that is gone without a trace (the machine restarted) is started again and resumes from
        its logged steps."""
        for task in await self.store.tasks(
            (TaskState.QUEUED, TaskState.RUNNING, TaskState.WAITING)
        ):
            if task.state == TaskState.QUEUED:
                await self._start(task)
                continue
            self.systemd.watch(worker_unit(task.id), partial(self._check_soon, task.id))
            if await self.systemd.status(worker_unit(task.id)) is None:
                log.info("task %s has no worker unit; starting it again to resume", task.id)
                async with self.records.locks[task.id]:
                    try:
                        layers = await self._layers_seen(task)
                        async with self._joins[task.workspace]:
                            await self._prepare_view(task, layers)
                        await self._start_units(task)
                    except (BoxError, SystemdError, OSError) as error:
                        await self._end(
                            task, TaskState.FAILED, f"The task could not resume: {error}"
                        )
            else:
                self._check_soon(task.id)

    def routes(self) -> dict[tuple[str, str], Callable[[Caller, list[str]], Awaitable[Any]]]:
        owner = {
            "CreateTask": self.create_task,
            "GetTask": self.get_task,
            "ListTasks": self.list_tasks,
            "StopTask": self.stop_task,
            "UndoTask": self.undo_task,
            "KeepTask": self.keep_task,
            "ListApprovals": self.approvals.list_approvals,
            "AnswerApproval": self.approvals.answer_approval,
            "ListWorkspaces": self.list_workspaces,
            "CreateWorkspace": self.create_workspace,
        }
        table: dict[tuple[str, str], Callable[[Caller, list[str]], Awaitable[Any]]] = {}
        for name, handler in owner.items():
            table[(api.MANAGER, name)] = handler
            table[(api.GATEWAY, name)] = _without_token(handler)
        table[(api.MANAGER, "RemoveWorkspace")] = self.remove_workspace
        table[(api.MANAGER, "GetSettings")] = self.get_settings
        table[(api.MANAGER, "SetSettings")] = self.set_settings
        table[(api.MANAGER, "CreateToken")] = self.create_token
        table[(api.MANAGER, "SetSecret")] = self.vault.set_secret
        table[(api.MANAGER, "RemoveSecret")] = self.vault.remove_secret
        table[(api.MANAGER, "ListSecrets")] = self.vault.list_secrets
        table[(api.BROKER, "GetTask")] = self.broker.broker_task
        table[(api.BROKER, "LogStep")] = self.broker.log_step
        table[(api.BROKER, "BeginCall")] = self.broker.begin_call
        table[(api.BROKER, "FinishCall")] = self.broker.finish_call
        table[(api.BROKER, "Ask")] = self.broker.ask
        table[(api.BROKER, "LogCost")] = self.broker.log_cost
        table[(api.BROKER, "LogRefusal")] = self.broker.log_refusal
        return table

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
        if (
            personal is None
            and request.files is None
            and not self.workspaces.exists(request.workspace)
        ):
            die(Problem.INVALID, f"no workspace {request.workspace}")
        for tool in request.tools:
            if find_tool(tool) is None:
                die(Problem.INVALID, f"no tool {tool}: it is not installed on this box")
        hosts = request.hosts
        if hosts is None:
            allowlist = settings.networkDefault == NetworkDefault.ALLOWLIST
            hosts = list(settings.defaultHosts) if allowlist else []
        droid = request.worker == Worker.DROID
        task_id = new_task_id()
        workspace = request.workspace
        folders: list[str] | None = None
        if personal is not None:
            checked = await asyncio.to_thread(
                check_folders, personal, owner_home(caller.user), settings.agentFolders, self.home
            )
            folders = [str(folder.path) for folder in checked]
            workspace = folder_workspace(checked)
        shared: list[dict[str, Any]] = []
        if request.files is not None:
            # Shared files make a workspace of their own; the log keeps names and sizes only.
            workspace = f"files-{task_id}"
            await self.workspaces.create(workspace, files=True)
            await self.workspaces.put(workspace, {f.name: f.content for f in request.files})
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
            source=request.source,
            model=request.model or (resolve_model(DEFAULT_MODEL) if droid else None),
            budgetCents=(
                request.budgetCents
                if request.budgetCents is not None
                else settings.defaultBudgetCents
            ),
            seat=request.seat,
            droid=request.droid if droid else None,
            folder=folders[0] if folders else None,
            folders=folders,
            createdAt=time.time(),
        )
        await self.store.save_task(
            task,
            EventKind.TASK_STATE,
            {
                "state": task.state.value,
                "title": task.title,
                "by": caller.name,
                **({"files": shared} if shared else {}),
            },
        )
        self.records.export(task)
        return (await self._start(task)).public()

    async def get_task(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        task = await self.records.task(args[0])
        steps = await self.store.events(task.id, EventKind.TASK_STEP)
        return {
            **task.public(),
            "steps": [{"seq": e.seq, "at": e.at, **e.data} for e in steps],
        }

    async def list_tasks(self, caller: Caller, args: list[str]) -> list[dict[str, Any]]:
        return [task.public() for task in reversed(await self.store.tasks())]

    async def stop_task(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        task = await self.records.task(args[0])
        async with self.records.locks[task.id]:
            task = await self.records.task(task.id)
            if task.state.ended:
                die(Problem.INVALID, f"task {task.id} has already ended: it is {task.state}")
            task = await self._end(task, TaskState.FAILED, STOPPED)
        return task.public()

    async def undo_task(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        """Takes a task's changes out of its workspace; tasks after it keep theirs. A task still
        running is stopped first."""
        task = await self.records.task(args[0])
        if task.folders:
            _owner_only(caller)
        async with self.records.locks[task.id]:
            task = await self.records.task(task.id)
            if task.state == TaskState.UNDONE:
                die(Problem.INVALID, f"task {task.id} is already undone")
            if task.review == Review.KEPT:
                die(
                    Problem.INVALID,
                    f"task {task.id} was kept: its changes are in your folders now, so it "
                    "cannot be undone",
                )
            if not task.state.ended:
                task = await self._end(task, TaskState.FAILED, UNDONE_WHILE_RUNNING)
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
        await self._collect_layers(task.workspace)
        return task.public()

    async def keep_task(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        """Applies a done personal task's changes, deletions included, to the real folders,
        unless a file it changed was changed there too since it started: then nothing is."""
        _owner_only(caller)
        task = await self.records.task(args[0])
        if not task.folders:
            die(
                Problem.INVALID,
                f"task {task.id} worked on workspace {task.workspace}, not on your folders: "
                "its changes are already in the workspace",
            )
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
        await self._collect_layers(task.workspace)
        return task.public()

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
        clash = await asyncio.to_thread(conflicts, changes, saw, places)
        state = {"state": task.state.value}
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
        try:
            applied = await asyncio.to_thread(apply, changes, layer, places)
        except UnsafePath as unsafe:
            die(Problem.INVALID, str(unsafe))
        task = task.model_copy(update={"review": Review.KEPT, "error": None})
        return task, {**state, "review": "kept", "applied": applied}

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

    async def get_settings(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        return (await self.store.settings()).model_dump(mode="json")

    async def set_settings(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        try:
            changes = json.loads(args[0])
        except json.JSONDecodeError as error:
            die(Problem.INVALID, f"the settings are not valid JSON: {error}")
        if not isinstance(changes, dict):
            die(Problem.INVALID, "the settings must be a JSON object of names and values")
        settings = change_settings(await self.store.settings(), changes)
        await self.store.save_settings(settings)
        return settings.model_dump(mode="json")

    async def create_token(self, caller: Caller, args: list[Any]) -> str:
        name = check_token_name(args[0])
        role = Role.APP if args[1] else Role.OWNER
        token = new_token()
        await self.store.add_token(token_hash(token), name, role.value, caller.user)
        return token

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

    async def _start(self, task: Task) -> Task:
        async with self.records.locks[task.id]:
            if task.worker == Worker.DROID:
                return await self._end(task, TaskState.FAILED, DROID_MISSING)
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
                except (BoxError, SystemdError, OSError) as error:
                    return await self._end(
                        task, TaskState.FAILED, f"The task could not start: {_words(error)}"
                    )
                task = task.model_copy(update={"state": TaskState.RUNNING})
                await self.records.record(task, EventKind.TASK_STATE, {"state": "running"})
            finally:
                self._starting.pop(task.id, None)
            return task

    async def _mirror(self, task: Task) -> None:
        """Brings the copy of the owner's folders up to date before a personal task starts."""
        assert task.folders is not None
        base = workspaces_dir(self.home) / task.workspace
        gid = grp.getgrnam(WORK_GROUP).gr_gid
        await asyncio.to_thread(sync_mirror, real_folders(task.folders), base, gid)

    async def _prepare_view(self, task: Task, layers: list[str]) -> None:
        """The task's user and its view of the workspace; for a personal task, a manifest of
        what it saw, to find conflicts when the owner keeps it. Under the workspace's lock."""
        user = task_user(task.id)
        directory = task_dir(self.home, task.id)
        directory.mkdir(mode=at_rest.TASK, exist_ok=True)
        at_rest.restrict(directory, at_rest.TASK)
        uid, _ = await ensure_user(user, directory)
        await task_home.prepare(self.home, task.id, uid)
        await self.layers.mount(task.id, task.workspace, layers, uid)
        manifest = task_manifest(self.home, task.id)
        if task.folders and not manifest.exists():
            seen = await asyncio.to_thread(take_manifest, task_work_dir(self.home, task.id))
            await asyncio.to_thread(save_manifest, seen, manifest)

    async def _start_units(self, task: Task) -> None:
        await netns.ensure(task.id)
        await self.systemd.start_unit(broker_socket_unit(task.id))
        for egress in egress_socket_units(task.id):
            await self.systemd.start_unit(egress)
        # Started now rather than on the worker's first connection, so the broker's start-up
        # overlaps the worker's instead of following it.
        await self.systemd.start_unit(broker_service_unit(task.id))
        unit = worker_unit(task.id)
        self.systemd.watch(unit, partial(self._check_soon, task.id))
        settings = await self.store.settings()
        await self.systemd.start_transient(unit, worker_properties(self.home, task, settings))

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
        job = asyncio.create_task(self._check(task_id))
        self._background.add(job)
        job.add_done_callback(self._background.discard)

    async def _check(self, task_id: str) -> None:
        """A worker unit changed: if it has finished, the task ends done or failed."""
        try:
            async with self.records.locks[task_id]:
                task = await self.store.task(task_id)
                if task is None or task.state.ended or task.state == TaskState.QUEUED:
                    return
                unit = worker_unit(task_id)
                status = await self.systemd.status(unit)
                if status is None or not status.finished:
                    return
                if status.active_state == "active" and status.result == "success":
                    await self._end(task, TaskState.DONE, None)
                else:
                    words = None if status.active_state == "inactive" else await last_words(unit)
                    await self._end(task, TaskState.FAILED, why_failed(status, words))
        except Exception:
            log.exception("could not follow the worker of task %s", task_id)

    async def _end(self, task: Task, state: TaskState, error: str | None) -> Task:
        """Stops the worker, then records the end: a done task's changes join its workspace in
        the same transaction; anything else's are thrown away. Then the broker's socket closes."""
        unit = worker_unit(task.id)
        self.systemd.unwatch(unit)
        await self._let_go(unit)
        recorded = False
        try:
            await self.layers.unmount(task.id)
            if state == TaskState.DONE:
                async with self._joins[task.workspace]:
                    layer = await self.store.next_layer(task.workspace)
                    await self.layers.join(task.id, task.workspace, layer_name(layer))
                    task = await self._record_end(task, state, error, layer)
                    recorded = True
        except (BoxError, OSError) as failure:
            message = failure.message if isinstance(failure, BoxError) else str(failure)
            state, error = TaskState.FAILED, f"Its changes could not be kept: {message}"
        if not recorded:
            task = await self._record_end(task, state, error, None)
            await self.layers.discard(task.id)
        pending = await self.store.approvals(ApprovalState.PENDING, task.id)
        if pending:
            await self.approvals.answer(task, tuple(pending), ApprovalState.DENIED, TASK_ENDED)
        for name in (
            broker_socket_unit(task.id),
            *egress_socket_units(task.id),
            broker_service_unit(task.id),
        ):
            await self._let_go(name)
        try:
            await netns.remove(task.id)
        except BoxError as failure:
            log.warning("%s", failure.message)
        await task_home.remove(self.home, task.id)
        await self._collect_layers(task.workspace)
        return task

    async def _record_end(
        self, task: Task, state: TaskState, error: str | None, layer: int | None
    ) -> Task:
        update: dict[str, Any] = {"state": state, "error": error, "endedAt": time.time()}
        if task.folders and state == TaskState.DONE:
            update["review"] = Review.PENDING
        task = task.model_copy(update=update)
        data: dict[str, Any] = {"state": state.value}
        if error:
            data["error"] = error
        await self.records.record(task, EventKind.TASK_STATE, data, layer=layer)
        return task

    async def _let_go(self, unit: str) -> None:
        try:
            await self.systemd.stop_unit(unit)
            await self.systemd.reset_failed(unit)
        except SystemdError as failure:
            log.warning("could not clean up %s: %s", unit, failure)


def _owner_only(caller: Caller) -> None:
    if caller.role != Role.OWNER:
        die(Problem.FORBIDDEN, OWNER_ONLY)


def _words(error: Exception) -> str:
    return error.message if isinstance(error, BoxError) else str(error)


def _without_token(
    handler: Callable[[Caller, list[str]], Awaitable[Any]],
) -> Callable[[Caller, list[str]], Awaitable[Any]]:
    async def call(caller: Caller, args: list[str]) -> Any:
        return await handler(caller, args[1:])

    return call
