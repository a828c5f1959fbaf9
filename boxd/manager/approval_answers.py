"""The owner's answers to what tasks ask: list what waits, approve or deny. A task that waited
runs again once nothing of it is pending."""

import time
from typing import Any

from boxd.approval import ApprovalState
from boxd.approval_record import Approval
from boxd.caller import Caller
from boxd.errors import Problem, die
from boxd.event import EventKind
from boxd.manager.pages import one_page, with_next
from boxd.manager.records import Records
from boxd.task import Task, TaskState


class ApprovalAnswers:
    def __init__(self, records: Records) -> None:
        self.records = records

    async def list_approvals(self, caller: Caller, args: list[str]) -> dict[str, Any]:
        """One page of what waits for an answer, in the order asked (boxd.manager.pages)."""

        async def fetch(after: int | None, limit: int) -> list[tuple[int, dict[str, Any] | None]]:
            rows = await self.records.store.approval_rows(
                ApprovalState.PENDING, None, after or 0, limit
            )
            return [(row, a.public() if a else None) for row, a in rows]

        approvals, following = await one_page(fetch, args[0])
        return with_next({"approvals": approvals}, following)

    async def answer_approval(self, caller: Caller, args: list[Any]) -> dict[str, Any]:
        approved: bool = args[1]
        found = await self.records.store.approval(args[0])
        if found is None:
            die(Problem.NOT_FOUND, f"no approval {args[0]}")
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
                task, EventKind.APPROVAL, data, approvals=(approval,), show=last
            )
        return task
