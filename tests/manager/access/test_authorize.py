"""Who a broker is: its unit, looked up once per connection, and not remembered for ever."""

from typing import cast

import pytest
from dbus_fast import Message
from dbus_fast.aio import MessageBus

from boxd.dbus import interface as api
from boxd.errors import BoxError
from boxd.manager.access import authorize
from boxd.manager.access.authorize import REMEMBERED_BROKERS, Authorizer
from boxd.manager.access.screen_sessions import ScreenSessions
from boxd.manager.record.store import Store
from boxd.manager.units.systemd import Systemd
from boxd.wire.caller import Role


class Units:
    """systemd's answer to "which unit is this process in": broker N's pid is N."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    async def unit_of_pid(self, pid: int) -> str:
        self.asked.append(pid)
        return f"box-broker@t{pid:09d}.service"


async def _pid(bus: MessageBus, sender: str) -> int:
    return int(sender.removeprefix(":1."))


@pytest.fixture
def authorizer(monkeypatch: pytest.MonkeyPatch) -> tuple[Authorizer, Units]:
    monkeypatch.setattr(authorize, "connection_pid", _pid)
    units = Units()
    found = Authorizer(
        cast(MessageBus, None), cast(Store, None), cast(Systemd, units), cast(ScreenSessions, None)
    )
    return found, units


def _log_step(sender: str, task_id: str) -> tuple[Message, api.Bound]:
    message = Message(
        sender=sender,
        path="/org/boxd/Box1",
        interface=api.BROKER,
        member=api.LOG_STEP.name,
        signature="ss",
        body=[task_id, "{}"],
    )
    return message, api.Bound(api.BROKER, api.LOG_STEP)


async def test_a_broker_acts_for_its_own_task_only_and_is_looked_up_once(
    authorizer: tuple[Authorizer, Units],
) -> None:
    check, units = authorizer
    for _ in range(3):
        caller = await check(*_log_step(":1.7", "t000000007"))
        assert (caller.role, caller.task) == (Role.BROKER, "t000000007")
    assert units.asked == [7]
    with pytest.raises(BoxError, match="only the broker of task t000000008 may do this"):
        await check(*_log_step(":1.7", "t000000008"))


async def test_brokers_that_came_and_went_are_not_remembered_for_ever(
    authorizer: tuple[Authorizer, Units],
) -> None:
    check, units = authorizer
    for pid in range(1, REMEMBERED_BROKERS + 101):
        await check(*_log_step(f":1.{pid}", f"t{pid:09d}"))
        # The first broker keeps talking, so it stays remembered.
        await check(*_log_step(":1.1", "t000000001"))
    assert len(check._brokers) == REMEMBERED_BROKERS
    assert units.asked.count(1) == 1
