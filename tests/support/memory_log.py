"""The manager behind a broker kept in memory (MemoryLog, MemoryWaiter), the broker served on a real
Unix socket with it, and until(): what the broker's tests share."""

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from boxd.broker.app import make_broker
from boxd.dbus.interface import BROKER, Method, bound_on
from boxd.errors import BoxError, Problem
from boxd.wire.models.key_use import (
    CallUse,
    QuestionUse,
    Use,
    first_refusal,
    input_hash,
    logged_call_use,
)
from tests.support.app_serving import runners
from tests.support.broker_serving import serving as serving_broker


class MemoryLog:
    """The manager's side of the broker, kept in memory: the log, answers, approvals, costs."""

    def __init__(self, prompt: str, tools: tuple[str, ...] = (), budget: int = 100) -> None:
        self.task: dict[str, Any] = {
            "id": "t000000001",
            "prompt": prompt,
            "tools": list(tools),
            "budgetCents": budget,
            "costCents": 0.0,
        }
        self.steps: list[dict[str, Any]] = []
        self.answers: dict[str, dict[str, Any]] = {}
        self.results: list[dict[str, Any]] = []
        self.approvals: dict[str, dict[str, Any]] = {}
        self.costs: list[dict[str, Any]] = []
        self.answered: dict[str, asyncio.Future[str]] = {}
        # key -> the call's tool.call line
        self.calls: dict[str, dict[str, Any]] = {}
        # (member, key) -> held until set: a test's way to order what the broker does.
        self.holds: dict[tuple[str, str], asyncio.Event] = {}
        self.held: set[tuple[str, str]] = set()

    @property
    def prompt(self) -> str:
        return str(self.task["prompt"])

    @prompt.setter
    def prompt(self, text: str) -> None:
        self.task["prompt"] = text

    def decide(self, approval_id: str, state: str) -> None:
        self.approvals[approval_id]["state"] = state
        self.answered.setdefault(approval_id, asyncio.get_running_loop().create_future())
        self.answered[approval_id].set_result(state)

    async def call(self, method: Method, *args: str) -> Any:
        member = bound_on(BROKER, method).name
        if member == "GetTask":
            return {"task": self.task, "steps": self.steps}
        data = json.loads(args[0])
        hold = self.holds.get((member, data.get("key", "")))
        if hold is not None:
            self.held.add((member, data["key"]))
            await hold.wait()
        if member == "LogStep":
            self.steps.append(data)
            return {"seq": len(self.steps), "kind": "task.step", "data": data}
        if member == "BeginCall":
            wanted = CallUse(data["tool"], input_hash(data["input"]), float(data["costCents"]))
            self.refuse(data["key"], wanted)
            self.calls.setdefault(data["key"], {**data, "inputHash": wanted.inputHash})
            return {
                "answered": self.answers.get(data["key"]),
                "spentCents": self.spent,
                "reservedCents": self.reserved(data["key"], wanted),
                "approval": self.approvals.get(self.approval_id(data["key"])),
            }
        if member == "FinishCall":
            if data["key"] not in self.answers:
                self.results.append(data)
                self.answers[data["key"]] = (
                    {"ok": True, "output": data["output"]}
                    if data["ok"]
                    else {"ok": False, "error": data["error"]}
                )
            return {"answered": self.answers[data["key"]], "spentCents": self.spent}
        if member == "Ask":
            use: Use
            if data.get("tool") is None:
                use = QuestionUse(data["question"], data.get("costCents"))
            else:
                begun = logged_call_use(self.calls[data["key"]])
                use = CallUse(data["tool"], begun.inputHash, data["costCents"])
            self.refuse(data["key"], use)
            approval_id = self.approval_id(data["key"])
            return self.approvals.setdefault(
                approval_id,
                {
                    "id": approval_id,
                    "state": "pending",
                    **data,
                    **({"inputHash": use.inputHash} if isinstance(use, CallUse) else {}),
                },
            )
        assert member == "LogCost"
        self.costs.append(data)
        return {"kind": "cost", "data": data}

    def approval_id(self, key: str) -> str:
        return f"{self.task['id']}.{key}"

    def refuse(self, key: str, wanted: Use) -> None:
        """The manager's rule: a key names one call or one question (boxd.wire.models.key_use)."""
        taken: list[Use] = []
        approval = self.approvals.get(self.approval_id(key))
        if approval is not None:
            taken.append(
                CallUse(approval["tool"], approval["inputHash"], approval["costCents"])
                if approval.get("tool")
                else QuestionUse(approval["question"], approval.get("costCents"))
            )
        if key in self.calls:
            taken.append(logged_call_use(self.calls[key]))
        why = first_refusal(key, tuple(taken), wanted)
        if why is not None:
            raise BoxError(Problem.INVALID, why)

    def reserved(self, key: str, call: CallUse) -> dict[str, float]:
        """Costs of the other calls that wait for the owner or were approved and not run."""
        return {
            other["key"]: float(other["costCents"])
            for other in self.approvals.values()
            if other.get("tool")
            and (other["state"] == "pending" or other["state"] == "approved")
            and other["key"] not in self.answers
            and other["key"] != key
            and (other["tool"], other["inputHash"]) != (call.tool, call.inputHash)
        }

    @property
    def spent(self) -> float:
        tools = sum(float(r["costCents"]) for r in self.results if r["ok"])
        return tools + sum(float(c["cents"]) for c in self.costs)


class MemoryWaiter:
    def __init__(self, log: MemoryLog) -> None:
        self.log = log

    async def wait(self, approval: dict[str, Any], seconds: float) -> str:
        if approval["state"] != "pending":
            return str(approval["state"])
        answer = self.log.answered.setdefault(
            approval["id"], asyncio.get_running_loop().create_future()
        )
        try:
            return await asyncio.wait_for(asyncio.shield(answer), seconds)
        except TimeoutError:
            return "pending"


@asynccontextmanager
async def serving(log: MemoryLog, tmp_path: Path) -> AsyncIterator[str]:
    """The broker's app over `log`, on a Unix socket in tmp_path, whose path it gives."""
    async with runners(tmp_path) as apps:
        broker = make_broker(log, MemoryWaiter(log), log.task, apps, wait_seconds=0.3)
        path = str(tmp_path / "broker.sock")
        async with serving_broker(broker, path):
            yield path


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the broker did not get there in 5 s")
