"""The owner's answers to what tasks ask: list what waits, approve or deny. A task that waited
runs again once nothing of it is pending. A task's broker waits for an answer with WaitApproval,
which is answered to that broker alone."""

import asyncio
import time
from typing import Any

from boxd.errors import Problem, die
from boxd.manager.pages import one_page, with_next
from boxd.manager.record.ledger import TaskSave
from boxd.manager.record.records import Records
from boxd.reading.decimal_text import decimal
from boxd.wire.approval import ApprovalState
from boxd.wire.caller import Caller
from boxd.wire.event import EventKind
from boxd.wire.ids import check_task_id
from boxd.wire.models.approval_record import Approval
from boxd.wire.models.task import Task, TaskState

# The longest one WaitApproval waits: a broker that waits longer asks again.
MAX_WAIT_MS = 600_000


def waiting_ms(text: str) -> int:
    wait = decimal(text)
    if wait is None or wait > MAX_WAIT_MS:
        die(Problem.INVALID, f"waitMs is a whole number of milliseconds up to {MAX_WAIT_MS}")
    return wait


class ApprovalAnswers:
    def __init__(self, records: Records) -> None:
        self.records = records
        # By approval id, the WaitApproval calls waiting for its answer.
        self._waiting: dict[str, set[asyncio.Future[str]]] = {}

    async def list_approvals(self, caller: Caller, page: str) -> dict[str, Any]:
        """One page of what waits for an answer, in the order asked (boxd.manager.pages)."""

        async def fetch(after: int | None, limit: int) -> list[tuple[int, dict[str, Any] | None]]:
            rows = await self.records.store.approval_rows(
                ApprovalState.PENDING, None, after or 0, limit
            )
            return [(row, a.public() if a else None) for row, a in rows]

        approvals, following = await one_page(fetch, page)
        return with_next({"approvals": approvals}, following)

    async def answer_approval(
        self, caller: Caller, approval_id: str, approved: bool
    ) -> dict[str, Any]:
        found = await self.records.store.approval(approval_id)
        if found is None:
            die(Problem.NOT_FOUND, f"no approval {approval_id}")
        async with self.records.locks[found.task]:
            approval = await self.records.store.approval(found.id)
            assert approval is not None
            if approval.state != ApprovalState.PENDING:
                die(
                    Problem.INVALID,
                    f"approval {approval.id} was already answered: {approval.state}",
                )
            state = ApprovalState.APPROVED if approved else ApprovalState.DENIED
            task = await self.records.task(approval.task)
            await self.answer(task, (approval,), state, caller.name)
            answered = await self.records.store.approval(approval.id)
        assert answered is not None
        return answered.public()

    async def wait_approval(
        self, caller: Caller, task_id: str, approval: str, wait_ms: str
    ) -> dict[str, str]:
        """The state of the task's approval once it is answered, or `pending` once waitMs have
        passed. Answered to the caller only, a method's reply: a signal would reach others."""
        task_id, approval_id, waiting = check_task_id(task_id), approval, waiting_ms(wait_ms)
        answered: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        # Listening before looking: an answer recorded after the look is told to this call.
        self._waiting.setdefault(approval_id, set()).add(answered)
        try:
            found = await self.records.store.approval(approval_id)
            if found is None or found.task != task_id:
                die(Problem.NOT_FOUND, f"no approval {approval_id} of task {task_id}")
            if found.state != ApprovalState.PENDING:
                return {"state": found.state.value}
            try:
                return {"state": await asyncio.wait_for(answered, waiting / 1000)}
            except TimeoutError:
                return {"state": ApprovalState.PENDING.value}
        finally:
            listening = self._waiting.get(approval_id)
            if listening is not None:
                listening.discard(answered)
                if not listening:
                    del self._waiting[approval_id]

    def _tell(self, approval_id: str, state: ApprovalState) -> None:
        for answered in self._waiting.pop(approval_id, set()):
            if not answered.done():
                answered.set_result(state.value)

    async def answer(
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
            for a in await self.records.store.approvals(ApprovalState.PENDING, task.id)
            if a.id not in closing
        ]
        if not still and task.state == TaskState.WAITING:
            task = task.model_copy(update={"state": TaskState.RUNNING})
        for number, approval in enumerate(answered):
            data = {"id": approval.id, "state": state.value, "by": by}
            last = number == len(answered) - 1
            await self.records.record(
                TaskSave(task, EventKind.APPROVAL, data, approvals=(approval,)), show=last
            )
            self._tell(approval.id, state)
        return task
