"""The owner's review of what a task did: its changes shown as a diff (diffs.py), undone (its
layer leaves its workspace's stack; a task still running is stopped first), or, for a task on
the owner's own folders, kept (keep.py: applied to the real folders unless a file it changed
was changed there too)."""

import asyncio
from pathlib import Path
from typing import Any

from boxd.errors import Problem, die
from boxd.manager.ending import Ending
from boxd.manager.folders.folders import asker_only, caller_uid, real_folders
from boxd.manager.folders.keep import KeepError, Places, keep, layer_changes, load_manifest
from boxd.manager.folders.owner_process import as_owner_work
from boxd.manager.pages import with_next
from boxd.manager.record.ledger import TaskSave
from boxd.manager.record.records import Records
from boxd.manager.record.store import Store
from boxd.manager.workspaces.diffs import diff_page
from boxd.manager.workspaces.layers import Layers, layer_name
from boxd.paths import task_manifest, workspaces_dir
from boxd.wire.caller import Caller
from boxd.wire.event import EventKind
from boxd.wire.models.task import Review, Task, TaskState

UNDONE_WHILE_RUNNING = "Stopped by its owner, to undo it."


def undo_waits_for_room(task_id: str) -> str:
    """As box.stop_waits_for_room, for an undo."""
    return (
        f"Task {task_id} is stopped: its worker no longer runs. The box's disk is full, so it "
        "is undone once there is room to record its end (free space by undoing other tasks or "
        "removing workspaces); until then it still shows as running."
    )


class ReviewMethods:
    def __init__(
        self, home: Path, store: Store, records: Records, layers: Layers, ending: Ending
    ) -> None:
        self.home = home
        self.store = store
        self.records = records
        self.layers = layers
        self.ending = ending

    async def undo_task(self, caller: Caller, task_id: str) -> dict[str, Any]:
        """Takes a task's changes out of its workspace; tasks after it keep theirs. A task still
        running is stopped first. On a full disk, as Box.stop_task."""
        task = await self.records.task(task_id)
        return await self.ending.unless_waiting_for_room(
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
                task = await self.ending.end(task, TaskState.FAILED, UNDONE_WHILE_RUNNING, waiting)
            found = await self.store.layer_of(task.id)
            joined = found is not None and found[1]
            update: dict[str, Any] = {"state": TaskState.UNDONE}
            if task.folders:
                update["review"] = Review.UNDONE
            task = task.model_copy(update=update)
            await self.records.record(
                TaskSave(
                    task,
                    EventKind.TASK_STATE,
                    {"state": "undone", "by": caller.name},
                    drop_layer=joined,
                )
            )
        await self.ending.cleared(task.id)
        # Before its layer's files may go (collect_layers): the new view no longer stacks it.
        await self.ending.views.remake(task.workspace)
        await self.ending.collect_layers(task.workspace)
        return task.public()

    async def keep_task(self, caller: Caller, task_id: str) -> dict[str, Any]:
        """Applies a done personal task's changes, deletions included, to the real folders,
        unless a file it changed was changed there too since it started: then nothing is."""
        task = await self.records.task(task_id)
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
            async with self.layers.joins[task.workspace]:
                task, data = await self._apply(
                    task, self.layers.store(task.workspace) / layer_name(found[0])
                )
            kept = task.review == Review.KEPT
            await self.records.record(
                TaskSave(task, EventKind.TASK_STATE, {**data, "by": caller.name}, drop_layer=kept)
            )
            if "stoppedAt" in data and task.error is not None:
                # Recorded first, so the log and the task's error say what was applied.
                await self.ending.views.remake(task.workspace)
                die(Problem.FAILED, task.error)
        await self.ending.views.remake(task.workspace)
        await self.ending.collect_layers(task.workspace)
        return task.public()

    async def diff_task(self, caller: Caller, task_id: str, page: str) -> dict[str, Any]:
        """One page of the review of what a task changed (boxd.manager.workspaces.diffs): its layer
        against the workspace as it saw it, which is what keep replaces when it applies anything
        (keep applies nothing if a path the task changed is no longer as the task saw it). Read
        without the task's lock: a running task may be reviewed as it works."""
        task = await self.records.task(task_id)
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
            found_page = await asyncio.to_thread(diff_page, layer, below, page, bool(task.folders))
        except OSError as error:
            die(
                Problem.FAILED,
                f"the changes of task {task.id} changed while they were read "
                f"({error.strerror or error}); ask again",
            )
        answer = {**head, "truncated": found_page.truncated, "files": found_page.files}
        return with_next(answer, found_page.next)

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
