"""What a task's broker asks of the manager: the task and its steps, logging steps, tool calls
and their results, costs, refusals, and questions for the owner. A broker acts for its own task
only (boxd.manager.access.authorize checks its unit)."""

import time
from typing import Any

from boxd.errors import Problem, die
from boxd.manager.asked import record_approval, tell_asked
from boxd.manager.model_requests import model_reserved
from boxd.manager.pages import one_page, with_next
from boxd.manager.record.key_uses import used
from boxd.manager.record.ledger import Ledger, TaskSave
from boxd.manager.record.records import Records, found, running
from boxd.wire.approval import ApprovalState, approval_id
from boxd.wire.caller import Caller
from boxd.wire.event import EventKind
from boxd.wire.ids import check_task_id
from boxd.wire.models.approval_record import Approval
from boxd.wire.models.broker_calls import CallResult, CallStart, CostRecord, NetRefusal, Question
from boxd.wire.models.event_record import Event
from boxd.wire.models.key_use import (
    CallUse,
    QuestionUse,
    Use,
    input_hash,
    logged_call_use,
)
from boxd.wire.models.plain_errors import parse
from boxd.wire.step import Step


class BrokerMethods:
    def __init__(self, records: Records) -> None:
        self.records = records

    async def broker_task(self, caller: Caller, task_id: str, page: str) -> dict[str, Any]:
        """The task and one page of its steps as `{text, data}` (boxd.manager.pages)."""
        task = await self.records.task(task_id)

        async def fetch(after: int | None, limit: int) -> list[tuple[int, dict[str, Any] | None]]:
            steps = await self.records.store.events(task.id, EventKind.TASK_STEP, after or 0, limit)
            return [(e.seq, e.data) for e in steps]

        steps, following = await one_page(fetch, page)
        return with_next({"task": task.public(), "steps": steps}, following)

    async def log_step(self, caller: Caller, task_id: str, step: str) -> dict[str, Any]:
        said = Step.read(step)
        task_id = check_task_id(task_id)

        def log(ledger: Ledger) -> Event:
            task = found(task_id, ledger.task(task_id))
            if task.state.ended:
                die(Problem.INVALID, f"task {task.id} has ended ({task.state}); it logs no more")
            task = task.model_copy(update={"step": said.text})
            return ledger.save_task(TaskSave(task, EventKind.TASK_STEP, said.json()))

        # Answered once the task's files and then the step are on disk: the store flushes the
        # task's file system before the commit that holds the step (boxd.manager.record.task_flush).
        async with self.records.locks[task_id]:
            event = await self.records.transact(log, flush=task_id)
        return event.model_dump(mode="json")

    async def begin_call(self, caller: Caller, task_id: str, call: str) -> dict[str, Any]:
        """Logs a call begun, unless its key is already used for something else (a 400 then).
        Says whether the key was answered, what the task spent, the costs reserved by its other
        calls that wait for the owner or were approved and not yet run and by its model requests
        in flight, and the key's own approval if it asked for one."""
        started = parse(CallStart, call)
        wanted = CallUse(started.tool, input_hash(started.input), started.costCents)
        task_id = check_task_id(task_id)

        def begin(ledger: Ledger) -> dict[str, Any]:
            task = running(found(task_id, ledger.task(task_id)))
            approval, logged = used(ledger, task.id, started.key, wanted)
            shares = _shared(ledger, task.id, started.sharesWith, wanted)
            answered = ledger.answer(task.id, started.key)
            # One tool.call line per key, however often a pending call is asked again.
            if answered is None and logged is None:
                data = {
                    **started.model_dump(mode="json", exclude={"sharesWith"}),
                    "inputHash": wanted.inputHash,
                    **({} if shares is None else {"sharesWith": shares}),
                }
                ledger.save_task(TaskSave(task, EventKind.TOOL_CALL, data))
            reserved = {
                other.key: other.costCents or 0.0
                for other in ledger.reserving_approvals(task.id)
                # The same call under another key would share this call's run, not add to it.
                if other.key != started.key
                and (other.tool, other.inputHash) != (started.tool, wanted.inputHash)
            }
            reserved.update(model_reserved(ledger, task.id))
            return {
                "answered": answered,
                "spentCents": task.costCents,
                "reservedCents": reserved,
                "approval": None if approval is None else approval.public(),
            }

        async with self.records.locks[task_id]:
            return await self.records.transact(begin)

    async def finish_call(self, caller: Caller, task_id: str, result: str) -> dict[str, Any]:
        done = parse(CallResult, result)
        task_id = check_task_id(task_id)

        def finish(ledger: Ledger) -> dict[str, Any]:
            task = found(task_id, ledger.task(task_id))
            logged = ledger.answer(task.id, done.key)
            if logged is None:
                logged = done.answer()
                charged = done.costCents if done.ok else 0
                task = task.model_copy(update={"costCents": task.costCents + charged})
                ledger.save_task(
                    TaskSave(
                        task,
                        EventKind.TOOL_RESULT,
                        {**done.model_dump(mode="json", exclude_none=True), "costCents": charged},
                        answer=(done.key, logged),
                    )
                )
            if done.sharedWith is None:
                # The keys that share this run get its result now, not in a FinishCall of
                # their own a killed broker might never send.
                for key in ledger.sharing(task.id, done.key):
                    if ledger.answer(task.id, key) is None:
                        shared = done.model_copy(
                            update={"key": key, "costCents": 0, "sharedWith": done.key}
                        )
                        ledger.save_task(
                            TaskSave(
                                task,
                                EventKind.TOOL_RESULT,
                                shared.model_dump(mode="json", exclude_none=True),
                                answer=(key, logged),
                            )
                        )
            return {"answered": logged, "spentCents": task.costCents}

        async with self.records.locks[task_id]:
            return await self.records.transact(finish)

    async def log_cost(self, caller: Caller, task_id: str, cost: str) -> dict[str, Any]:
        spent = parse(CostRecord, cost)
        task_id = check_task_id(task_id)

        def log(ledger: Ledger) -> Event:
            task = running(found(task_id, ledger.task(task_id)))
            task = task.model_copy(update={"costCents": task.costCents + spent.cents})
            return ledger.save_task(
                TaskSave(task, EventKind.COST, spent.model_dump(mode="json", exclude_none=True))
            )

        async with self.records.locks[task_id]:
            event = await self.records.transact(log)
        return event.model_dump(mode="json")

    async def log_refusal(self, caller: Caller, task_id: str, refusal: str) -> dict[str, Any]:
        """The task's proxy refused a connection: the log says where to and why."""
        refused = parse(NetRefusal, refusal)
        task_id = check_task_id(task_id)

        def log(ledger: Ledger) -> Event:
            task = found(task_id, ledger.task(task_id))
            return ledger.save_task(
                TaskSave(task, EventKind.NET_REFUSED, refused.model_dump(mode="json"))
            )

        async with self.records.locks[task_id]:
            event = await self.records.transact(log)
        return event.model_dump(mode="json")

    async def ask(self, caller: Caller, task_id: str, ask: str) -> dict[str, Any]:
        """An /ask's question or the OK a call needs (`tool` set): the approval records the one
        thing it approves, and asking again with its key finds it. A model request's OK is asked
        by BeginModelRequest (boxd.manager.model_requests)."""
        question = parse(Question, ask)
        task_id = check_task_id(task_id)

        def asking(ledger: Ledger) -> tuple[Approval, bool]:
            """The key's approval, and whether it is new."""
            task = found(task_id, ledger.task(task_id))
            wanted: Use
            if question.tool is None:
                wanted = QuestionUse(
                    question.question, question.costCents, question.payee, question.purpose
                )
            else:
                # The approval binds the input the key's tool.call line logged.
                logged = ledger.logged_call(task.id, question.key)
                begun = None if logged is None else logged_call_use(logged).inputHash
                wanted = CallUse(question.tool, begun, question.costCents)
            asked, logged = used(ledger, task.id, question.key, wanted)
            if isinstance(wanted, CallUse) and logged is None:
                die(Problem.INVALID, f"key {question.key} began no call to approve")
            if asked is not None:
                return asked, False
            if task.state.ended:
                die(Problem.INVALID, f"task {task.id} has ended ({task.state}); it asks no more")
            approval = Approval(
                id=approval_id(task.id, question.key),
                task=task.id,
                state=ApprovalState.PENDING,
                askedAt=time.time(),
                **question.model_dump(exclude_none=True),
                inputHash=wanted.inputHash if isinstance(wanted, CallUse) else None,
            )
            record_approval(ledger, task, approval)
            return approval, True

        async with self.records.locks[task_id]:
            approval, new = await self.records.transact(asking)
        if new:
            tell_asked(self.records.bus, approval)
        return approval.public()


def _shared(ledger: Ledger, task_id: str, first: str | None, wanted: CallUse) -> str | None:
    """The key whose run a call shares, to record: only the same call (a 400 for another), and
    only one begun (its BeginCall may have been refused: then this call runs on its own)."""
    if first is None:
        return None
    logged = ledger.logged_call(task_id, first)
    if logged is None:
        return None
    theirs = logged_call_use(logged)
    if (theirs.tool, theirs.inputHash) != (wanted.tool, wanted.inputHash):
        die(Problem.INVALID, f"the call {first} is not this call: another tool or input")
    return first
