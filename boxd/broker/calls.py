"""`POST /call`: a tool run with keys that make it happen once.

- A key names one call (tool, input, cost) for good: the manager refuses it for anything else
  (another call, a question) with a 400 before anything runs (boxd.wire.models.key_use).
- A key already answered in the log returns the logged result; the tool does not run again.
- A key whose call was cut off (broker killed, power cut) runs again, with the same `ctx.key`.
- The same tool with the same input while a first call is running or waiting shares that call:
  approved once, charged once; the later key is answered with the same result.
- A broker told to stop (its task ended, the box shutting down) lets the tools already running
  finish and record their results first, for up to FINISH_SECONDS, and starts no other.
- Over budget (calls in flight included: running here, or waiting for the owner, or approved and
  not yet run, as the record says), by autonomy, or always for some tools: the owner is asked
  first; denied never runs the tool; no answer in time returns a pending result, and the
  approval stays open for the same key or the same tool and input.
"""

import asyncio
import json
import logging
from dataclasses import dataclass, replace
from typing import Any

from boxd.broker.app_link import Apps
from boxd.broker.budget import why_ask
from boxd.broker.manager_link import Manager, Waiter
from boxd.dbus import interface as api
from boxd.errors import Problem, die
from boxd.reading.canonical_json import input_hash
from boxd.reading.caps import MAX_LABEL, data, text
from boxd.reading.json_reader import body as json_body
from boxd.wire.approval import ApprovalState, key

log = logging.getLogger(__name__)

PENDING_CALL = {
    "ok": False,
    "pending": True,
    "error": "Waiting for the box owner to approve this spend. Call this tool again to check.",
}
NOT_APPROVED = "not approved"
# How long a broker told to stop waits for the tools already running to finish and record their
# results: a tool cut off after it acted (a payment booked) would leave no tool.result. Well
# under the broker unit's TimeoutStopSec (units/box-broker@.service), so its SIGKILL never
# comes first.
FINISH_SECONDS = 30.0
STOPPING = (
    "The broker is stopping (its task ended, or the box is shutting down): the tool did not "
    "run. Call it again with the same key once the task runs again."
)


@dataclass(frozen=True)
class CallRequest:
    """The body of `POST /call`. Read without pydantic: the tool's input model is its app's,
    and only the app's runner loads it."""

    tool: str
    input: Any
    key: str

    @classmethod
    def read(cls, raw: bytes) -> "CallRequest":
        fields = json_body(raw)
        request = cls(
            fields.required("tool", text("tool", MAX_LABEL)),
            fields.optional("input", data("input"), None),
            fields.checked_default("key", key, ""),
        )
        fields.done()
        return request


@dataclass(frozen=True)
class _Call:
    key: str
    name: str
    # As the task sent it, for the runner to validate again as it runs the tool.
    given: Any
    # As the tool validated it: what the log, the hash and the owner's question show.
    input: Any
    cost: float
    needs_ok: bool

    @property
    def same(self) -> tuple[str, str]:
        """What makes two calls the same call, whatever their keys."""
        return (self.name, input_hash(self.input))


class Calls:
    def __init__(
        self,
        manager: Manager,
        waiter: Waiter,
        task: dict[str, Any],
        apps: Apps,
        wait_seconds: float,
    ) -> None:
        self._manager = manager
        self._waiter = waiter
        self._task = task
        self._apps = apps
        self._wait_seconds = wait_seconds
        self._spent = float(task.get("costCents", 0))
        # key -> cost of the calls this broker is running or waiting on; the record keeps those
        # that wait for the owner across a restart (BeginCall's reservedCents).
        self._reserved: dict[str, float] = {}
        # By (tool, input hash): what runs is one call, whichever key started it.
        self._running: dict[tuple[str, str], asyncio.Task[dict[str, Any]]] = {}
        # (tool, input hash) -> the key of the first call, running or waiting for an answer.
        self._first: dict[tuple[str, str], str] = {}
        # The runs whose tool has started and whose result is not recorded yet.
        self._tools: set[asyncio.Task[Any]] = set()
        self._stopping = False

    async def finish(self, seconds: float = FINISH_SECONDS) -> None:
        """The broker is stopping: no tool starts any more, and the ones running finish and
        record their results, for up to `seconds`. Calls waiting for the owner are not waited
        for: their tool has not run, and the approval stays for the same key."""
        self._stopping = True
        if self._tools:
            log.info("letting %d tool call(s) finish before the broker stops", len(self._tools))
            await asyncio.wait(set(self._tools), timeout=seconds)

    def busy(self) -> bool:
        """Whether a call is running its tool or waiting for the owner, its caller there or
        not (a caller that hung up does not cut off a shared call): the broker is not idle."""
        return bool(self._running)

    def reserved(self) -> dict[str, float]:
        """key -> cost of the calls this broker is running or waiting on now."""
        return dict(self._reserved)

    async def _check(self, request: CallRequest) -> _Call:
        if request.tool not in self._task["tools"]:
            allowed = ", ".join(self._task["tools"]) or "none"
            die(Problem.INVALID, f"this task may not call {request.tool} (its tools: {allowed})")
        given = request.input if request.input is not None else {}
        checked = await self._apps.check(request.tool, given)
        return _Call(
            request.key, request.tool, given, checked.input, checked.cost, checked.needs_ok
        )

    async def call(self, body: bytes) -> dict[str, Any]:
        request = CallRequest.read(body)
        call = await self._check(request)
        same = call.same
        # Taken on arrival, so a call that comes while the first one runs shares it.
        first = self._first.setdefault(same, call.key)
        try:
            # The key is claimed for this call before it shares or runs anything.
            begun = await self._begin(call, None if first == call.key else first)
        except BaseException:
            self._forget(same, call.key)
            raise
        if begun["answered"] is not None:
            self._forget(same, call.key)
            return dict(begun["answered"])
        own = begun if first == call.key else None
        result = await self._once(same, replace(call, key=first), own)
        if result.get("pending"):
            return result
        if self._first.get(same) == first:
            del self._first[same]
        if first != call.key:
            await self._share(call, first, result)
        return result

    def _forget(self, same: tuple[str, str], key: str) -> None:
        """`key` leaves the place of its call's first key unless its run has begun: it was
        refused, or answered before."""
        if self._first.get(same) == key and same not in self._running:
            del self._first[same]

    async def _begin(self, call: _Call, shares: str | None = None) -> dict[str, Any]:
        begun = await self._manager.call(
            api.BEGIN_CALL,
            json.dumps(
                {
                    "key": call.key,
                    "tool": call.name,
                    "input": call.input,
                    "costCents": call.cost,
                    **({} if shares is None else {"sharesWith": shares}),
                }
            ),
        )
        return dict(begun)

    async def _once(
        self, same: tuple[str, str], call: _Call, begun: dict[str, Any] | None
    ) -> dict[str, Any]:
        job = self._running.get(same)
        if job is None:
            started = asyncio.create_task(self._run(call, begun))
            self._running[same] = job = started
            started.add_done_callback(
                lambda _: self._running.pop(same) if self._running.get(same) is started else None
            )
        # Shielded: a caller that hangs up does not cut off a tool that others share.
        return await asyncio.shield(job)

    async def _share(self, call: _Call, first: str, result: dict[str, Any]) -> None:
        await self._manager.call(
            api.FINISH_CALL,
            json.dumps(
                {
                    "key": call.key,
                    "tool": call.name,
                    "ok": result["ok"],
                    "output": result.get("output"),
                    "error": result.get("error"),
                    "costCents": 0,
                    "sharedWith": first,
                }
            ),
        )

    async def _run(self, call: _Call, begun: dict[str, Any] | None) -> dict[str, Any]:
        if begun is None:
            begun = await self._begin(call)
        if begun["answered"] is not None:
            return dict(begun["answered"])
        self._spent = float(begun["spentCents"])
        others = {**begun["reservedCents"], **self._reserved}
        others.pop(call.key, None)
        in_flight = sum(float(cost) for cost in others.values())
        self._reserved[call.key] = call.cost
        try:
            question = why_ask(
                self._task,
                call.name,
                call.needs_ok,
                call.cost,
                self._spent,
                in_flight=in_flight,
                given=call.input,
            )
            # A call that asked once waits for that answer, even if it would fit now.
            approval = begun["approval"]
            if approval is None and question is not None:
                approval = await self._manager.call(
                    api.ASK,
                    json.dumps(
                        {
                            "key": call.key,
                            "question": question,
                            "costCents": call.cost,
                            "tool": call.name,
                        }
                    ),
                )
            if approval is not None:
                state = await self._waiter.wait(approval, self._wait_seconds)
                if state == ApprovalState.PENDING:
                    return PENDING_CALL
                if state == ApprovalState.DENIED:
                    return await self._finish(call, False, None, NOT_APPROVED, 0)
            return await self._execute(call, call.cost)
        finally:
            self._reserved.pop(call.key, None)

    async def _execute(self, call: _Call, cost: float) -> dict[str, Any]:
        if self._stopping:
            die(Problem.UNAVAILABLE, STOPPING)
        run = asyncio.current_task()
        assert run is not None  # _execute runs in its call's own task (_once)
        self._tools.add(run)
        try:
            return await self._execute_now(call, cost)
        finally:
            self._tools.discard(run)

    async def _execute_now(self, call: _Call, cost: float) -> dict[str, Any]:
        # In the app's runner: a 503 if it went away mid-run (the key runs again), a 507 if the
        # disk was full; neither is the call's answer, so neither is recorded.
        ran = await self._apps.run(call.name, call.given, call.key, self._task)
        if ran["ok"]:
            return await self._finish(call, True, ran["output"], None, cost)
        return await self._finish(call, False, None, ran["error"], 0)

    async def _finish(
        self, call: _Call, ok: bool, output: Any, error: str | None, cost: float
    ) -> dict[str, Any]:
        finished = await self._manager.call(
            api.FINISH_CALL,
            json.dumps(
                {
                    "key": call.key,
                    "tool": call.name,
                    "ok": ok,
                    "output": output,
                    "error": error,
                    "costCents": cost,
                }
            ),
        )
        self._spent = float(finished["spentCents"])
        return dict(finished["answered"])
