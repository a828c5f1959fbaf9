"""How boxd reads a worker's end from the real systemd, when the unit does not wait for it.

boxd used to call a task "stopped from outside" when it read its worker's unit `inactive` with no
exit status (1 or 2 of 498 tasks started 8 at a time). Two ways to get there, both played here
with boxd's own Systemd class against the real systemd, right after StartTransientUnit as boxd's
check of a new worker does:
- the start job is queued and not yet run: the unit is `inactive`, and has not even begun;
- the program exits before its start job completes: the unit lands `inactive` in spite of
  RemainAfterExit and is garbage-collected at once, and reading it afterwards finds a fresh,
  never-run unit of the same name. These units have no RemainAfterExit at all, so they are
  collected every time.
"""

import json

from testbed.machine import Machine

# Runs in the machine with boxd's venv: starts transient units shaped like a worker (Type=exec)
# that end at once, and prints what Systemd.status() made of each once it had finished.
PROBE = """
import asyncio, json, sys
from dbus_fast import BusType, Variant
from dbus_fast.aio import MessageBus
from boxd.manager.units.systemd import Systemd

async def one(systemd, name, argv):
    changed = asyncio.Event()
    systemd.watch(name, changed.set)
    await systemd.start_transient(name, [
        ("Type", Variant("s", "exec")),
        ("ExecStart", Variant("a(sasb)", [[argv[0], argv, False]])),
    ])
    while True:
        changed.clear()
        status = await systemd.status(name)
        if status is not None and status.finished:
            break
        await asyncio.wait_for(changed.wait(), 30)
    systemd.unwatch(name)
    return {"succeeded": status.succeeded, "code": status.main_code, "status": status.main_status}

async def main():
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    systemd = Systemd(bus)
    await systemd.subscribe()
    runs = [one(systemd, f"boxd-exit-{n}.service", ["/bin/true"]) for n in range(20)]
    runs += [one(systemd, f"boxd-fail-{n}.service", ["/bin/sh", "-c", "exit 3"]) for n in range(5)]
    print(json.dumps(await asyncio.gather(*runs)))

asyncio.run(main())
"""


def test_an_exit_is_read_even_after_the_unit_is_collected(machine: Machine) -> None:
    done = machine.run("/usr/lib/boxd/venv/bin/python", "-c", PROBE, timeout=120)
    ends = json.loads(done.stdout)
    assert ends[:20] == [{"succeeded": True, "code": 1, "status": 0}] * 20
    assert ends[20:] == [{"succeeded": False, "code": 1, "status": 3}] * 5
