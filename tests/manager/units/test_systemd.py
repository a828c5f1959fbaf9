"""boxd.manager.units.systemd against a real bus daemon (a private session bus, no systemd)."""

import asyncio

import pytest
from dbus_fast.aio import MessageBus

from boxd.manager.units.systemd import Systemd
from boxd.patches.dbus_fast import gathered, patient
from tests.support.dbus_daemon import bus_address  # noqa: F401  (a fixture)


async def test_a_call_once_the_bus_is_closed_fails_at_once(bus_address: str) -> None:  # noqa: F811
    """As boxd stops it closes its bus, then cancels what still runs: a doctor's probe stops its
    unit in a `finally`. dbus-fast answers no call made on a closed bus, so that one waited for
    ever, and systemd killed boxd 90 s later (TimeoutStopSec)."""
    # As boxd.manager.main connects: its writes gathered at the end of the loop's turn.
    bus = gathered(patient(await MessageBus(bus_address=bus_address).connect()))
    systemd = Systemd(bus)
    bus.disconnect()
    await bus.wait_for_disconnect()  # type: ignore[no-untyped-call]
    with pytest.raises(EOFError, match="boxd is off the system bus, so systemd was not asked"):
        await asyncio.wait_for(systemd.stop_unit("boxd-doctor-bpf-1-x.service"), 5)
