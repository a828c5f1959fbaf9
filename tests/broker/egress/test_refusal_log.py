import asyncio
import json
from typing import Any

import pytest
from pydantic import ValidationError

from boxd.broker.egress.refusal_log import RefusalLog, host_of
from boxd.dbus.interface import BROKER, Method, bound_on
from boxd.errors import BoxError, Problem
from boxd.wire.models.broker_calls import NetRefusal

REASON = "it is not in this task's hosts"


class SlowManager:
    """A manager that answers only when told to, as one that is restarting."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answer = asyncio.Event()

    async def call(self, method: Method, *args: str) -> Any:
        member = bound_on(BROKER, method).name
        self.calls.append((member, json.loads(args[0])))
        await self.answer.wait()
        raise BoxError(Problem.UNAVAILABLE, "boxd is not running")


class Manager:
    """A manager that logs at once, and counts the calls it is in at the same time."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.inside = 0
        self.most_inside = 0

    async def call(self, method: Method, *args: str) -> Any:
        member = bound_on(BROKER, method).name
        assert member == "LogRefusal"
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        await asyncio.sleep(0)
        self.lines.append(json.loads(args[0]))
        self.inside -= 1

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for line in self.lines:
            found[line["target"]] = found.get(line["target"], 0) + line["count"]
        return found


class FakeClock:
    """Time that moves only when the test says so; sleepers wake when it passes their time."""

    def __init__(self) -> None:
        self.now = 100.0
        self._moved = asyncio.Condition()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        until = self.now + seconds
        async with self._moved:
            await self._moved.wait_for(lambda: self.now >= until)

    async def advance(self, seconds: float) -> None:
        self.now += seconds
        async with self._moved:
            self._moved.notify_all()
        await settle()


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def fake_log(manager: Manager) -> tuple[RefusalLog, FakeClock]:
    clock = FakeClock()
    return RefusalLog(manager, clock=clock, sleep=clock.sleep), clock


async def test_a_refusal_is_answered_without_waiting_for_the_log() -> None:
    manager = SlowManager()
    refusals = RefusalLog(manager)
    await asyncio.wait_for(refusals("other.test:80", REASON), 1)
    await settle()
    assert manager.calls == [
        ("LogRefusal", {"target": "other.test:80", "reason": REASON, "count": 1})
    ]
    manager.answer.set()
    # A log that fails is a warning, not an error for the proxy.
    await refusals.close()


async def test_a_flood_is_one_line_per_host_per_second_and_loses_no_count() -> None:
    manager = Manager()
    refusals, clock = fake_log(manager)
    for _ in range(1000):
        await refusals("other.test:80", REASON)
        await asyncio.sleep(0)
    await settle()
    # The first at once; the other 999 wait for the second to end.
    assert manager.lines == [{"target": "other.test:80", "reason": REASON, "count": 1}]
    await clock.advance(0.5)
    for _ in range(500):
        await refusals("other.test:443", REASON)
    await settle()
    assert len(manager.lines) == 1
    await clock.advance(0.5)
    assert manager.lines[1:] == [{"target": "other.test:80", "reason": REASON, "count": 1499}]
    for _ in range(500):
        await refusals("other.test:80", REASON)
    await clock.advance(0.99)
    assert len(manager.lines) == 2
    await clock.advance(0.01)
    assert len(manager.lines) == 3
    await refusals.close()
    assert manager.counts() == {"other.test:80": 2000}
    assert len(manager.lines) == 3
    assert manager.most_inside == 1


async def test_after_a_quiet_second_a_host_is_logged_at_once_again() -> None:
    manager = Manager()
    refusals, clock = fake_log(manager)
    await refusals("a.test:80", REASON)
    await settle()
    await clock.advance(5)
    await refusals("a.test:80", "another reason")
    await settle()
    assert [line["count"] for line in manager.lines] == [1, 1]
    assert manager.lines[1]["reason"] == "another reason"
    await refusals.close()


async def test_hosts_are_kept_apart() -> None:
    manager = Manager()
    refusals, clock = fake_log(manager)
    for _ in range(3):
        await refusals("a.test:80", REASON)
        await refusals("[2001:db8::1]:443", REASON)
        await settle()
    assert manager.counts() == {"a.test:80": 1, "[2001:db8::1]:443": 1}
    await clock.advance(1)
    assert manager.counts() == {"a.test:80": 3, "[2001:db8::1]:443": 3}
    assert len(manager.lines) == 4
    await refusals.close()


async def test_many_hosts_share_one_line_past_the_limit() -> None:
    manager = Manager()
    refusals, clock = fake_log(manager)
    hosts = RefusalLog.MAX_HOSTS + 500
    for _ in range(3):
        for n in range(hosts):
            await refusals(f"h{n}.test:80", REASON)
            await asyncio.sleep(0)
        await clock.advance(0.4)
    await clock.advance(1)
    await refusals.close()
    # Each kept host: its first line, then one with the rest; the others: one line, then one.
    assert len(manager.lines) == 2 * (RefusalLog.MAX_HOSTS + 1)
    assert sum(manager.counts().values()) == 3 * hosts
    others = [line for line in manager.lines if line["target"].endswith(" and other hosts")]
    assert others[0]["target"] == f"h{RefusalLog.MAX_HOSTS}.test:80 and other hosts"
    assert sum(line["count"] for line in others) == 3 * 500


async def test_closing_logs_what_is_held_without_waiting_out_the_second() -> None:
    manager = Manager()
    refusals, _ = fake_log(manager)
    for _ in range(10):
        await refusals("a.test:80", REASON)
        await settle()
    # The clock never moves: the nine held refusals go out because the broker stops.
    await asyncio.wait_for(refusals.close(), 1)
    assert [line["count"] for line in manager.lines] == [1, 9]


async def test_a_slow_manager_makes_counts_grow_not_calls() -> None:
    manager = SlowManager()
    refusals, clock = fake_log(manager)  # type: ignore[arg-type]
    for _ in range(100):
        await refusals("a.test:80", REASON)
        await clock.advance(0.5)
    assert len(manager.calls) == 1
    manager.answer.set()
    await settle()
    await refusals.close()
    assert [call[1]["count"] for call in manager.calls] == [1, 99]


def test_host_of_a_target() -> None:
    assert host_of("example.com:443") == "example.com"
    assert host_of("[2001:db8::1]:443") == "[2001:db8::1]"
    assert host_of("oddity") == "oddity"


@pytest.mark.parametrize("count", [0, -1, 2**53, 1.5, "3", True])
def test_the_manager_takes_only_a_plain_positive_count(count: object) -> None:
    with pytest.raises(ValidationError):
        NetRefusal.model_validate({"target": "a.test:80", "reason": REASON, "count": count})


def test_a_refusal_without_a_count_stands_for_one() -> None:
    assert NetRefusal.model_validate({"target": "a.test:80", "reason": REASON}).count == 1
