"""The box: creates tasks, starts their users and units, follows the units, records every
change. Only this class changes a task's state, and always under that task's lock."""

import asyncio
import json
import logging
import os
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from dbus_fast import Message
from dbus_fast.aio import MessageBus

from boxd.approval import TASK_ENDED, Approval, ApprovalState, approval_id
from boxd.apps.registry import find_tool
from boxd.broker_wire import CallResult, CallStart, CostRecord, NetRefusal, Question
from boxd.caller import Caller, Role
from boxd.claude_models import DEFAULT_MODEL, resolve_model
from boxd.dbus import interface as api
from boxd.dbus.task_object import TaskObject
from boxd.errors import BoxError, Problem, die
from boxd.event import EventKind
from boxd.ids import check_task_id, new_task_id, task_user
from boxd.manager import netns
from boxd.manager.exit_words import why_failed
from boxd.manager.last_words import last_words
from boxd.manager.layers import MAX_DONE, Layers, layer_name
from boxd.manager.store import Store
from boxd.manager.systemd import Systemd, SystemdError
from boxd.manager.tokens import check_token_name, new_token, token_hash
from boxd.manager.users import ensure_user
from boxd.manager.vault import Vault
from boxd.manager.worker_unit import (
    broker_service_unit,
    broker_socket_unit,
    egress_socket_units,
    worker_properties,
    worker_unit,
)
from boxd.manager.workspaces import Workspaces
from boxd.paths import task_dir
from boxd.plain_errors import parse
from boxd.settings import NetworkDefault, change_settings
from boxd.step import Step
from boxd.task import Task, TaskState
from boxd.task_request import Worker, parse_task_request

log = logging.getLogger(__name__)

DROID_MISSING = (
    "This box cannot run Droid tasks yet: the Droid worker is not installed here. "
    "Start the task with worker fake, or wait for the Droid worker."
)
STOPPED = "Stopped by its owner."
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
        self._joins: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._objects: dict[str, TaskObject] = {}
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._background: set[asyncio.Task[None]] = set()

    # Start-up and recovery.

    async def open(self) -> None:
        (self.home / "tasks").mkdir(parents=True, exist_ok=True)
        self.workspaces.open()
        os.chmod(self.home, 0o755)
        os.chmod(self.home / "tasks", 0o755)
        self.vault.open()
        await self.systemd.subscribe()
        for task in await self.store.tasks():
            self._export(task)

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
                async with self._locks[task.id]:
                    try:
                        await self._start_units(task, await self._layers_seen(task))
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
            "ListApprovals": self.list_approvals,
            "AnswerApproval": self.answer_approval,
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
        table[(api.BROKER, "GetTask")] = self.broker_task
        table[(api.BROKER, "LogStep")] = self.log_step
        table[(api.BROKER, "BeginCall")] = self.begin_call
        table[(api.BROKER, "FinishCall")] = self.finish_call
        table[(api.BROKER, "Ask")] = self.ask
        table[(api.BROKER, "LogCost")] = self.log_cost
        table[(api.BROKER, "LogRefusal")] = self.log_refusal
        return table

    # The owner's methods.

    async def create_task(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        request = parse_task_request(args[0])
        settings = await self.store.settings()
        if request.files is None and not self.workspaces.exists(request.workspace):
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
        shared: list[dict[str, Any]] = []
        if request.files is not None:
            # Shared files make a workspace of their own; the log keeps names and sizes only.
            workspace = f"files-{task_id}"
            await self.workspaces.create(workspace)
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
        self._export(task)
        return (await self._start(task)).public()

    async def get_task(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        task = await self._task(args[0])
        steps = await self.store.events(task.id, EventKind.TASK_STEP)
        return {
            **task.public(),
            "steps": [{"seq": e.seq, "at": e.at, **e.data} for e in steps],
        }

    async def list_tasks(self, caller: Caller, args: list[str]) -> list[dict[str, Any]]:
        return [task.public() for task in reversed(await self.store.tasks())]

    async def stop_task(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        task = await self._task(args[0])
        async with self._locks[task.id]:
            task = await self._task(task.id)
            if task.state.ended:
                die(Problem.INVALID, f"task {task.id} has already ended: it is {task.state}")
            task = await self._end(task, TaskState.FAILED, STOPPED)
        return task.public()

    async def undo_task(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        """Takes a task's changes out of its workspace; tasks after it keep theirs. A task still
        running is stopped first."""
        task = await self._task(args[0])
        async with self._locks[task.id]:
            task = await self._task(task.id)
            if task.state == TaskState.UNDONE:
                die(Problem.INVALID, f"task {task.id} is already undone")
            if not task.state.ended:
                task = await self._end(task, TaskState.FAILED, UNDONE_WHILE_RUNNING)
            found = await self.store.layer_of(task.id)
            joined = found is not None and found[1]
            task = task.model_copy(update={"state": TaskState.UNDONE})
            event = await self.store.save_task(
                task,
                EventKind.TASK_STATE,
                {"state": "undone", "by": caller.name},
                drop_layer=joined,
            )
            self._changed(task)
            self._objects[task.id].tell(event)
        if found is not None and joined:
            await self._forget_layer(task.workspace, task.id, found[0])
        return task.public()

    async def _forget_layer(self, workspace: str, task_id: str, number: int) -> None:
        """Deletes an undone layer's files, unless a running task still stacks it: its view
        must not change under it. Then the files stay, out of every new task's stack."""
        unfinished = (TaskState.QUEUED, TaskState.RUNNING, TaskState.WAITING)
        if any(task_id in t.saw for t in await self.store.tasks(unfinished)):
            log.info(
                "layer %s of task %s stays on disk while tasks that saw it run", number, task_id
            )
            return
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

    async def create_token(self, caller: Caller, args: list[str]) -> str:
        name = check_token_name(args[0])
        token = new_token()
        await self.store.add_token(token_hash(token), name, Role.OWNER.value)
        return token

    # The broker's methods.

    async def broker_task(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        task = await self._task(args[0])
        steps = await self.store.events(task.id, EventKind.TASK_STEP)
        return {"task": task.public(), "steps": [e.data for e in steps]}

    async def log_step(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        step = parse(Step, args[1])
        async with self._locks[args[0]]:
            task = await self._task(args[0])
            if task.state.ended:
                die(Problem.INVALID, f"task {task.id} has ended ({task.state}); it logs no more")
            task = task.model_copy(update={"step": step.text})
            event = await self.store.save_task(
                task, EventKind.TASK_STEP, step.model_dump(mode="json")
            )
            self._changed(task)
            self._objects[task.id].tell(event)
        return event.model_dump(mode="json")

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

    async def list_approvals(self, caller: Caller, args: list[str]) -> list[dict[str, Any]]:
        return [a.public() for a in await self.store.approvals(ApprovalState.PENDING)]

    async def answer_approval(self, caller: Caller, args: list[Any]) -> dict[str, Any]:
        approved: bool = args[1]
        found = await self.store.approval(args[0])
        if found is None:
            die(Problem.NOT_FOUND, f"no approval {args[0]}")
        async with self._locks[found.task]:
            approval = await self.store.approval(found.id)
            assert approval is not None
            if approval.state != ApprovalState.PENDING:
                die(
                    Problem.INVALID,
                    f"approval {approval.id} was already answered: {approval.state}",
                )
            state = ApprovalState.APPROVED if approved else ApprovalState.DENIED
            await self._answer(await self._task(approval.task), (approval,), state, caller.name)
            answered = await self.store.approval(approval.id)
        assert answered is not None
        return answered.public()

    async def _answer(
        self, task: Task, approvals: tuple[Approval, ...], state: ApprovalState, by: str
    ) -> Task:
        """Answers approvals of one task; the task runs again once nothing of it is pending."""
        now = time.time()
        answered = tuple(
            a.model_copy(update={"state": state, "answeredAt": now, "answeredBy": by})
            for a in approvals
        )
        closing = {a.id for a in answered}
        still = [
            a
            for a in await self.store.approvals(ApprovalState.PENDING, task.id)
            if a.id not in closing
        ]
        if not still and task.state == TaskState.WAITING:
            task = task.model_copy(update={"state": TaskState.RUNNING})
        for number, approval in enumerate(answered):
            data = {"id": approval.id, "state": state.value, "by": by}
            event = await self.store.save_task(
                task, EventKind.APPROVAL, data, approvals=(approval,)
            )
            if number == len(answered) - 1:
                self._changed(task)
            self._objects[task.id].tell(event)
        return task

    # The broker's calls, costs and questions.

    async def begin_call(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        call = parse(CallStart, args[1])
        async with self._locks[args[0]]:
            task = await self._running(args[0])
            logged = await self.store.answer(task.id, call.key)
            # One tool.call line per key, however often a pending call is asked again.
            if logged is None and not await self.store.call_logged(task.id, call.key):
                event = await self.store.save_task(
                    task, EventKind.TOOL_CALL, call.model_dump(mode="json")
                )
                self._objects[task.id].tell(event)
        return {"answered": logged, "spentCents": task.costCents}

    async def finish_call(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        result = parse(CallResult, args[1])
        async with self._locks[args[0]]:
            task = await self._task(args[0])
            logged = await self.store.answer(task.id, result.key)
            if logged is None:
                logged = result.answer()
                charged = result.costCents if result.ok else 0
                task = task.model_copy(update={"costCents": task.costCents + charged})
                event = await self.store.save_task(
                    task,
                    EventKind.TOOL_RESULT,
                    {**result.model_dump(mode="json", exclude_none=True), "costCents": charged},
                    answer=(result.key, logged),
                )
                self._changed(task)
                self._objects[task.id].tell(event)
        return {"answered": logged, "spentCents": task.costCents}

    async def log_cost(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        cost = parse(CostRecord, args[1])
        async with self._locks[args[0]]:
            task = await self._running(args[0])
            task = task.model_copy(update={"costCents": task.costCents + cost.cents})
            event = await self.store.save_task(
                task, EventKind.COST, cost.model_dump(mode="json", exclude_none=True)
            )
            self._changed(task)
            self._objects[task.id].tell(event)
        return event.model_dump(mode="json")

    async def log_refusal(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        """The task's proxy refused a connection: the log says where to and why."""
        refusal = parse(NetRefusal, args[1])
        async with self._locks[args[0]]:
            task = await self._task(args[0])
            event = await self.store.save_task(
                task, EventKind.NET_REFUSED, refusal.model_dump(mode="json")
            )
            self._objects[task.id].tell(event)
        return event.model_dump(mode="json")

    async def ask(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        question = parse(Question, args[1])
        async with self._locks[args[0]]:
            task = await self._task(args[0])
            found = await self.store.approval(approval_id(task.id, question.key))
            if found is not None:
                return found.public()
            if task.state.ended:
                die(Problem.INVALID, f"task {task.id} has ended ({task.state}); it asks no more")
            approval = Approval(
                id=approval_id(task.id, question.key),
                task=task.id,
                state=ApprovalState.PENDING,
                askedAt=time.time(),
                **question.model_dump(exclude_none=True),
            )
            if task.state == TaskState.RUNNING:
                task = task.model_copy(update={"state": TaskState.WAITING})
            event = await self.store.save_task(
                task, EventKind.APPROVAL, approval.public(), approvals=(approval,)
            )
            self._changed(task)
            self._objects[task.id].tell(event)
        self.bus.send(
            Message.new_signal(
                api.ROOT_PATH,
                api.MANAGER,
                api.APPROVAL_ASKED,
                "s",
                [approval.model_dump_json(exclude_none=True)],
            )
        )
        return approval.public()

    async def _running(self, task_id: str) -> Task:
        task = await self._task(task_id)
        if task.state.ended:
            die(Problem.INVALID, f"task {task.id} has ended ({task.state})")
        return task

    # The task's life.

    async def _task(self, task_id: str) -> Task:
        task = await self.store.task(check_task_id(task_id))
        if task is None:
            die(Problem.NOT_FOUND, f"no task {task_id}")
        return task

    def _export(self, task: Task) -> None:
        if task.id not in self._objects:
            self._objects[task.id] = TaskObject(task)
            self.bus.export(api.task_path(task.id), self._objects[task.id])

    def _changed(self, task: Task) -> None:
        self._objects[task.id].update(task)

    async def _start(self, task: Task) -> Task:
        async with self._locks[task.id]:
            if task.worker == Worker.DROID:
                return await self._end(task, TaskState.FAILED, DROID_MISSING)
            stack = await self.store.stack(task.workspace)
            if len(stack) >= MAX_DONE:
                return await self._end(task, TaskState.FAILED, _full(task.workspace))
            task = task.model_copy(update={"saw": [done for _, done in stack]})
            try:
                await self._start_units(task, [layer_name(number) for number, _ in stack])
            except (BoxError, SystemdError, OSError) as error:
                return await self._end(task, TaskState.FAILED, f"The task could not start: {error}")
            task = task.model_copy(update={"state": TaskState.RUNNING})
            event = await self.store.save_task(task, EventKind.TASK_STATE, {"state": "running"})
            self._changed(task)
            self._objects[task.id].tell(event)
            return task

    async def _start_units(self, task: Task, layers: list[str]) -> None:
        user = task_user(task.id)
        directory = task_dir(self.home, task.id)
        directory.mkdir(mode=0o755, exist_ok=True)
        uid, _ = await ensure_user(user, directory)
        await self.layers.mount(task.id, task.workspace, layers, uid)
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
            async with self._locks[task_id]:
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
            await self._answer(task, tuple(pending), ApprovalState.DENIED, TASK_ENDED)
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
        return task

    async def _record_end(
        self, task: Task, state: TaskState, error: str | None, layer: int | None
    ) -> Task:
        task = task.model_copy(update={"state": state, "error": error, "endedAt": time.time()})
        data: dict[str, Any] = {"state": state.value}
        if error:
            data["error"] = error
        event = await self.store.save_task(task, EventKind.TASK_STATE, data, layer=layer)
        self._changed(task)
        self._objects[task.id].tell(event)
        return task

    async def _let_go(self, unit: str) -> None:
        try:
            await self.systemd.stop_unit(unit)
            await self.systemd.reset_failed(unit)
        except SystemdError as failure:
            log.warning("could not clean up %s: %s", unit, failure)


def _without_token(
    handler: Callable[[Caller, list[str]], Awaitable[Any]],
) -> Callable[[Caller, list[str]], Awaitable[Any]]:
    async def call(caller: Caller, args: list[str]) -> Any:
        return await handler(caller, args[1:])

    return call
