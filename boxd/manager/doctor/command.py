"""`boxd doctor`, as root on the machine: the manager's checks (boxd.manager.doctor.checks), run
here and printed; exit status 1 when one that blocks tasks failed, else 0."""

import asyncio
import json
import os
import sys

from dbus_fast import BusType
from dbus_fast.aio import MessageBus

from boxd.errors import Problem, die
from boxd.manager.doctor.checks import on_this_machine, run_checks
from boxd.manager.units.systemd import Systemd
from boxd.paths import box_home
from boxd.wire.doctor import blocking, public, report


async def _check(as_json: bool) -> int:
    if os.geteuid() != 0:
        die(
            Problem.FORBIDDEN,
            "boxd doctor makes trial mounts, namespaces and units: run it as root (sudo boxd "
            "doctor); as the box's owner, boxctl doctor asks boxd to check",
        )
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    try:
        systemd = Systemd(bus)
        await systemd.subscribe()
        findings = await run_checks(on_this_machine(box_home(), bus, systemd))
    finally:
        bus.disconnect()
    print(json.dumps(public(findings), indent=2) if as_json else report(findings))
    return 1 if blocking(findings) else 0


def main(as_json: bool) -> None:
    sys.exit(asyncio.run(_check(as_json)))
