"""The broker's calls to the manager while boxd restarts: asked again, except a step, which
the manager may have logged before it died; its worker looks in GET /task first."""

from typing import Any

import pytest

from boxd.broker.manager_link import ManagerLink
from boxd.dbus.interface import BROKER, BROKER_GET_TASK, LOG_STEP, Method, bound_on
from boxd.errors import BoxError, Problem

AWAY = BoxError(Problem.UNAVAILABLE, "boxd is not running")


class DyingManager:
    """Answers `away` for the first `misses` calls, then the call's member."""

    def __init__(self, misses: int) -> None:
        self.misses = misses
        self.calls: list[str] = []

    async def call(self, method: Method, *args: str) -> Any:
        member = bound_on(BROKER, method).name
        self.calls.append(member)
        if len(self.calls) <= self.misses:
            raise AWAY
        return member


def link(manager: DyingManager) -> ManagerLink:
    made = ManagerLink.__new__(ManagerLink)
    made.task_id = "t000000001"
    made._client = manager  # type: ignore[assignment]
    return made


async def test_a_read_is_asked_again_until_the_manager_is_back() -> None:
    manager = DyingManager(misses=2)
    assert await link(manager).call(BROKER_GET_TASK, "") == "GetTask"
    assert manager.calls == ["GetTask"] * 3


async def test_a_step_is_sent_once_and_its_worker_asks_again() -> None:
    """On main the broker sent it again: a manager killed after it committed the step and
    before it answered (NoReply) logged it twice (bench/chaos.py, seed 1691230390)."""
    manager = DyingManager(misses=1)
    with pytest.raises(BoxError) as caught:
        await link(manager).call(LOG_STEP, '{"text": "x"}')
    assert caught.value.problem == Problem.UNAVAILABLE
    assert manager.calls == ["LogStep"]
