import asyncio
import json
from typing import Any

from boxd.broker.refusal_log import RefusalLog
from boxd.errors import BoxError, Problem


class SlowManager:
    """A manager that answers only when told to, as one that is restarting."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answer = asyncio.Event()

    async def call(self, member: str, *args: str) -> Any:
        self.calls.append((member, json.loads(args[0])))
        await self.answer.wait()
        raise BoxError(Problem.UNAVAILABLE, "boxd is not running")


async def test_a_refusal_is_answered_without_waiting_for_the_log() -> None:
    manager = SlowManager()
    refusals = RefusalLog(manager)
    await asyncio.wait_for(refusals("other.test:80", "it is not in this task's hosts"), 1)
    await asyncio.sleep(0)
    assert manager.calls == [
        ("LogRefusal", {"target": "other.test:80", "reason": "it is not in this task's hosts"})
    ]
    manager.answer.set()
    # A log that fails is a warning, not an error for the proxy.
    await refusals.close()
