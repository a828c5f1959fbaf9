"""The money of a task's model requests, as the manager records it for the task's model gateway
(boxd.broker.model.gateway, which tells it through boxd.broker.model.cost_reports).

- `BeginModelRequest`: before a request goes, its worst case (boxd.wire.pricing.reservation_cents:
  the estimate of its input at the dearest rate it may be billed, and max_tokens at the output
  price) is reserved, counted with the task's other requests in flight, the calls its broker
  runs, and the calls that wait for the owner or were approved and not yet run. Where that would
  take the task past its budget the owner is asked first, in the same transaction, so two
  requests at once never both fit in room for one. The approval's key is `model.<sha256 of the
  body>`, so Droid's retries of the same bytes find it; an approved request goes under its
  approval. One yes lets one request through: the approval is spent once a request under it is
  answered 200 (its key then has an answer, as a call's key has once it ran), and the same bytes
  later ask again under `model.<hash>.2`, `.3`… A request that got no 200 (Droid retries those)
  may go again under it; while one under it is in flight, another waits (a 529).
- `LogModelCost`: at the reply's start, what message_start said is charged and the input part
  of the reservation is let go; at its end the rest is charged, with what is left of the
  reservation when the reply never said its final usage, and the request is closed. Costs are
  recorded after the task has ended too: the upstream was paid all the same.
- A request whose broker is gone (killed, crashed, a power cut) can say no more: it is charged
  what it still reserves, and its approval is spent, once the manager sees its holder gone: when
  another broker of the task begins a request, when the task's broker is stopped at its end, and
  when boxd starts. A holder is the bus's id and the broker's unique connection name: unique
  names are never used twice on one bus, and a new bus (a reboot) has another id.
"""

import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Any, Protocol

from dbus_fast.aio import MessageBus

from boxd.dbus.bus_daemon import bus_id, name_owner
from boxd.errors import Problem, die
from boxd.manager.asked import record_approval, tell_asked
from boxd.manager.record.key_uses import used
from boxd.manager.record.ledger import Ledger, TaskSave
from boxd.manager.record.records import Records, found, running
from boxd.wire.approval import ApprovalState, approval_id
from boxd.wire.caller import Caller
from boxd.wire.event import EventKind
from boxd.wire.ids import check_task_id
from boxd.wire.models.approval_record import Approval
from boxd.wire.models.broker_calls import CostRecord, ModelCost, ModelStart
from boxd.wire.models.key_use import ModelUse
from boxd.wire.models.plain_errors import parse
from boxd.wire.models.task import Task
from boxd.wire.pricing import Tokens, price_cents, reservation_cents
from boxd.wire.task_budget import spending_limit

log = logging.getLogger(__name__)

MODEL_KEY_PREFIX = "model."


def approval_key(request_hash: str, number: int) -> str:
    """The key of the `number`th approval asked for the same bytes."""
    key = f"{MODEL_KEY_PREFIX}{request_hash}"
    return key if number == 1 else f"{key}.{number}"


@dataclass(frozen=True)
class OpenRequest:
    """A model request forwarded and not yet closed: what its worst case was made of, and the
    token counts its reply said so far, already charged."""

    id: str
    holder: str
    model: str
    request_hash: str
    # Its input's estimate and its max_tokens of output, priced at their dearest.
    input_cents: float
    output_cents: float
    max_tokens: int
    approval_key: str | None
    # What the reply said so far (cumulative), and charged.
    charged: Tokens

    @property
    def input_known(self) -> bool:
        """Whether the reply has said what its input was (message_start did)."""
        c = self.charged
        return bool(c.input or c.cacheWrite or c.cacheRead)

    @property
    def reserved(self) -> float:
        """What it may still cost beyond what was charged: its output's worst case, and its
        input's until the reply has said it."""
        output_charged = price_cents(self.model, Tokens(input=0, output=self.charged.output))
        input_left = 0.0 if self.input_known else self.input_cents
        return input_left + max(self.output_cents - output_charged, 0.0)

    def worst(self, said: Tokens) -> float:
        """The most the reply can have cost, given what it said: its input as said (or the
        estimate, if it said none), and at least its max_tokens of output."""
        most = replace(said, output=max(said.output, self.max_tokens))
        estimate = 0.0 if said.input or said.cacheWrite or said.cacheRead else self.input_cents
        return price_cents(self.model, most) + estimate

    def record(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "requestHash": self.request_hash,
            "inputCents": self.input_cents,
            "outputCents": self.output_cents,
            "maxTokens": self.max_tokens,
            "approvalKey": self.approval_key,
            "charged": self.charged.json(),
        }

    @classmethod
    def read(cls, request_id: str, holder: str, record: dict[str, Any]) -> "OpenRequest":
        return cls(
            id=request_id,
            holder=holder,
            model=str(record["model"]),
            request_hash=str(record["requestHash"]),
            input_cents=float(record["inputCents"]),
            output_cents=float(record["outputCents"]),
            max_tokens=int(record["maxTokens"]),
            approval_key=record.get("approvalKey"),
            charged=Tokens(**record["charged"]),
        )


def _grown(said: Tokens, charged: Tokens) -> Tokens:
    """Each count as it stands now: a count said lower later is not given back."""
    return Tokens(
        input=max(said.input, charged.input),
        output=max(said.output, charged.output),
        cacheWrite=max(said.cacheWrite, charged.cacheWrite),
        cacheRead=max(said.cacheRead, charged.cacheRead),
        cacheWrite1h=min(
            max(said.cacheWrite1h, charged.cacheWrite1h),
            max(said.cacheWrite, charged.cacheWrite),
        ),
    )


def _difference(now: Tokens, before: Tokens) -> Tokens:
    return Tokens(
        input=now.input - before.input,
        output=now.output - before.output,
        cacheWrite=now.cacheWrite - before.cacheWrite,
        cacheRead=now.cacheRead - before.cacheRead,
        cacheWrite1h=max(now.cacheWrite1h - before.cacheWrite1h, 0),
    )


def open_requests(ledger: Ledger, task_id: str) -> list[OpenRequest]:
    return [OpenRequest.read(*row) for row in ledger.model_requests(task_id)]


def model_reserved(ledger: Ledger, task_id: str) -> dict[str, float]:
    """What the task's model requests in flight reserve, by a name for each."""
    return {f"model request {r.id}": r.reserved for r in open_requests(ledger, task_id)}


def _limit(task: Task) -> float:
    return spending_limit(task.budgetCents, task.droid.autonomy if task.droid else None)


def _shown_cents(cents: float) -> str:
    """Cents as the owner reads them, a reservation rounded up to a hundredth."""
    return f"{math.ceil(cents * 100) / 100:g}"


def _latest_approval(
    ledger: Ledger, task_id: str, request_hash: str
) -> tuple[Approval | None, int]:
    """The latest approval asked for these bytes and its number, or None and the number the
    next one takes. Each approval but the last was spent by a request under it."""
    number = 1
    latest: Approval | None = None
    while True:
        key = approval_key(request_hash, number)
        found_approval, _ = used(ledger, task_id, key, ModelUse(request_hash))
        if found_approval is None:
            return latest, number
        latest = found_approval
        number += 1


def _spent(ledger: Ledger, approval: Approval) -> bool:
    return ledger.answer(approval.task, approval.key) is not None


def _charge(
    ledger: Ledger,
    task: Task,
    model: str,
    cents: float,
    tokens: Tokens | None,
    *,
    reserved: bool = False,
    spend: str | None = None,
) -> Task:
    """Adds `cents` to the task's cost in a `cost` event; `spend` is an approval key to mark
    spent in the same write."""
    record = CostRecord(
        cents=cents,
        what="model",
        model=model,
        tokens=None if tokens is None else tokens.json(),
        reserved=True if reserved else None,
    )
    task = task.model_copy(update={"costCents": task.costCents + cents})
    if spend is not None and ledger.answer(task.id, spend) is not None:
        spend = None
    ledger.save_task(
        TaskSave(
            task,
            EventKind.COST,
            record.model_dump(mode="json", exclude_none=True),
            answer=None if spend is None else (spend, {"ok": True, "output": {"status": 200}}),
        )
    )
    return task


class Presence(Protocol):
    """Who holds a request, and whether they are still there: BusPresence, or a test's own."""

    async def holder(self, sender: str) -> str: ...

    async def alive(self, holder: str) -> bool: ...


class BusPresence:
    """A holder is the bus's id and the broker's unique connection name."""

    def __init__(self, bus: MessageBus) -> None:
        self._bus = bus
        self._id: str | None = None

    async def _this_bus(self) -> str:
        if self._id is None:
            self._id = await bus_id(self._bus)
        return self._id

    async def holder(self, sender: str) -> str:
        return f"{await self._this_bus()}/{sender}"

    async def alive(self, holder: str) -> bool:
        """Whether the broker connection that holds a request is still on this bus."""
        bus, _, sender = holder.partition("/")
        if bus != await self._this_bus():
            return False
        return await name_owner(self._bus, sender) is not None


class ModelRequests:
    def __init__(self, records: Records, presence: Presence | None = None) -> None:
        self.records = records
        self.presence = presence or BusPresence(records.bus)

    async def begin(self, caller: Caller, task_id: str, request: str) -> dict[str, Any]:
        start = parse(ModelStart, request)
        task_id = check_task_id(task_id)
        holder = await self.presence.holder(caller.name)

        def begin(ledger: Ledger) -> tuple[dict[str, Any], Approval | None, bool]:
            """The answer, a new approval to tell of, and whether other holders' requests are
            open (some may be gone)."""
            task = running(found(task_id, ledger.task(task_id)))
            settings = ledger.settings()
            if start.maxTokens > settings.modelMaxTokens:
                die(
                    Problem.INVALID,
                    f"max_tokens is {start.maxTokens:,}, over this box's cap of "
                    f"{settings.modelMaxTokens:,} output tokens a model request (Settings "
                    "modelMaxTokens): a reply's worst case is reserved from the task's budget "
                    "before it is sent",
                )
            if task.model is None:
                die(Problem.INVALID, f"task {task.id} names no model, so it has none to reach")
            admitted = {"admitted": True, "upstream": settings.modelBaseUrl}
            requests = open_requests(ledger, task.id)
            others = any(r.holder != holder for r in requests)
            if any(r.id == start.request for r in requests):
                # Sent again after an answer that never came back: it is in already.
                return admitted, None, others
            input_cents, output_cents = reservation_cents(
                task.model, start.inputTokens, start.maxTokens, start.hourCache
            )
            limit = _limit(task)
            approval, number = _latest_approval(ledger, task.id, start.requestHash)
            under: str | None = None
            if approval is not None and not (
                approval.state == ApprovalState.APPROVED and _spent(ledger, approval)
            ):
                if approval.state != ApprovalState.APPROVED:
                    return {"approval": approval.public(), "budgetCents": limit}, None, others
                if any(r.approval_key == approval.key for r in requests):
                    return {"taken": True, "budgetCents": limit}, None, others
                under = approval.key
            else:
                # By key: a call the broker runs or waits on may also be an approval the
                # record holds, and is one call.
                calls = {a.key: a.costCents or 0.0 for a in ledger.reserving_approvals(task.id)}
                calls.update(start.inFlight)
                reserved = sum(r.reserved for r in requests) + sum(calls.values())
                worst = input_cents + output_cents
                if task.costCents + reserved + worst > limit:
                    asked = self._approval(
                        task, approval_key(start.requestHash, number), start, worst, reserved
                    )
                    record_approval(ledger, task, asked)
                    return {"approval": asked.public(), "budgetCents": limit}, asked, others
            request = OpenRequest(
                id=start.request,
                holder=holder,
                model=task.model,
                request_hash=start.requestHash,
                input_cents=input_cents,
                output_cents=output_cents,
                max_tokens=start.maxTokens,
                approval_key=under,
                charged=Tokens(input=0, output=0),
            )
            ledger.put_model_request(task.id, request.id, holder, request.record())
            return admitted, None, others

        async with self.records.locks[task_id]:
            answer, asked, others = await self.records.transact(begin)
        if asked is not None:
            tell_asked(self.records.bus, asked)
        if others:
            await self.settle_gone(task_id)
        return answer

    def _approval(
        self, task: Task, key: str, start: ModelStart, worst: float, reserved: float
    ) -> Approval:
        model = str(task.model)
        held = (
            f", with {_shown_cents(reserved)} cents more held for requests and calls not yet "
            "finished"
            if reserved
            else ""
        )
        question = (
            f"Let task {task.id} ask its model ({model}) once more? It has spent "
            f"{task.costCents:g} cents{held}; this request may cost up to "
            f"{_shown_cents(worst)} cents, which would take it past its budget of "
            f"{_limit(task):g} cents."
        )
        return Approval(
            id=approval_id(task.id, key),
            task=task.id,
            key=key,
            state=ApprovalState.PENDING,
            question=question,
            costCents=worst,
            model=model,
            inputHash=start.requestHash,
            askedAt=time.time(),
        )

    async def log_cost(self, caller: Caller, task_id: str, cost: str) -> dict[str, Any]:
        reported = parse(ModelCost, cost)
        task_id = check_task_id(task_id)

        def log_part(ledger: Ledger) -> dict[str, Any]:
            task = found(task_id, ledger.task(task_id))
            request = next(
                (r for r in open_requests(ledger, task.id) if r.id == reported.request), None
            )
            if request is None:
                # Sent again after an answer that never came back, or charged already as left
                # by a broker that was gone.
                return {"logged": False}
            # Counts are the reply's so far, not since the last part: a part that never came
            # (the manager away, a full disk) is made up by the next.
            said = _grown(Tokens(**reported.tokens.model_dump()), request.charged)
            grown = _difference(said, request.charged)
            if reported.part == "start":
                if grown != Tokens(input=0, output=0):
                    _charge(ledger, task, request.model, price_cents(request.model, grown), grown)
                started = replace(request, charged=said)
                ledger.put_model_request(task.id, request.id, request.holder, started.record())
                return {"logged": True}
            ledger.drop_model_request(task.id, request.id)
            # A request the upstream never got is not billed (unreachable, refused before it
            # was sent); nor is an error's answer. One that went and got no answer at all (no
            # head in time, cut off as its broker stopped) may have been worked on: charged as
            # a reply that never said its usage.
            answered = reported.status == 200 or (reported.status == 0 and reported.sent)
            if not answered:
                # An approval it went under may be used again (Droid's retries).
                return {"logged": True}
            cents, reserved = price_cents(request.model, grown), False
            if not reported.complete:
                worst = request.worst(said) - price_cents(request.model, request.charged)
                if worst > cents:
                    cents, reserved = worst, True
            _charge(
                ledger,
                task,
                request.model,
                cents,
                grown,
                reserved=reserved,
                spend=request.approval_key,
            )
            return {"logged": True}

        async with self.records.locks[task_id]:
            return await self.records.transact(log_part)

    async def settle_gone(self, task_id: str) -> None:
        """Charges the task's open requests whose broker is gone what they still reserve."""
        rows = await self.records.store.model_requests(task_id)
        holders = {row[1] for row in rows}
        gone = {holder for holder in holders if not await self.presence.alive(holder)}
        if not gone:
            return

        def settle(ledger: Ledger) -> int:
            task = found(task_id, ledger.task(task_id))
            settled = 0
            for request in open_requests(ledger, task.id):
                if request.holder not in gone:
                    continue
                ledger.drop_model_request(task.id, request.id)
                task = _charge(
                    ledger,
                    task,
                    request.model,
                    request.reserved,
                    None,
                    reserved=True,
                    spend=request.approval_key,
                )
                settled += 1
            return settled

        async with self.records.locks[task_id]:
            settled = await self.records.transact(settle)
        if settled:
            log.info(
                "task %s: %d model request(s) whose broker is gone charged what they reserved",
                task_id,
                settled,
            )

    async def settle_all_gone(self) -> None:
        """At boxd's start: every task's requests whose broker is gone."""
        for task_id in await self.records.store.tasks_with_model_requests():
            await self.settle_gone(task_id)
