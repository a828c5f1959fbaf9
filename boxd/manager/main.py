"""`boxd manager`: the system service that owns org.boxd.Box1 (Type=notify, with watchdog)."""

import asyncio
import logging
import os
import sys

import sdnotify
from dbus_fast import BusType, RequestNameReply
from dbus_fast.aio import MessageBus

from boxd.dbus.incoming_fds import guarded
from boxd.dbus.interface import BUS_NAME
from boxd.dbus.server import Server
from boxd.doors.stopping import until_stopped
from boxd.errors import Problem, die
from boxd.manager.access.authorize import Authorizer
from boxd.manager.box import Box
from boxd.manager.record.schema import TOO_NEW_EXIT, RecordTooNew
from boxd.manager.record.store import Store
from boxd.manager.record.task_flush import TaskFlush
from boxd.manager.units.systemd import Systemd
from boxd.patches.dbus_fast import gathered, patient
from boxd.paths import box_home, database_path, tasks_dir

log = logging.getLogger("boxd")


async def _keep_watchdog_fed(notifier: sdnotify.SystemdNotifier) -> None:
    # Fed from the event loop itself, so a loop that stops turning gets boxd restarted.
    usec = int(os.environ.get("WATCHDOG_USEC", "0") or 0)
    if usec <= 0:
        return
    while True:
        notifier.notify("WATCHDOG=1")
        await asyncio.sleep(usec / 2_000_000)


async def run() -> None:
    home = box_home()
    home.mkdir(parents=True, exist_ok=True)
    store = Store(database_path(home), TaskFlush(tasks_dir(home)))
    await store.open()
    # A group commit's answers and signals leave in one write (boxd.patches.dbus_fast). It
    # passes file descriptors (an opened workspace file), every incoming one guarded first.
    connected = await MessageBus(bus_type=BusType.SYSTEM, negotiate_unix_fd=True).connect()
    bus = gathered(patient(guarded(connected)))
    systemd = Systemd(bus)
    box = Box(home, store, bus, systemd)
    await box.open()
    server = Server(bus, Authorizer(bus, store, systemd, box.screen))
    for method, handler in box.routes().items():
        server.handle(method, handler)
    if await bus.request_name(BUS_NAME) != RequestNameReply.PRIMARY_OWNER:
        die(Problem.FAILED, f"another process already owns {BUS_NAME} on the system bus")
    box.records.publish()
    await box.recover()
    notifier = sdnotify.SystemdNotifier()
    notifier.notify("READY=1")
    log.info("boxd is ready; BOX_HOME is %s", home)
    # Once ready, so that its processes do not slow the start: a task's start before they
    # answer waits for them (boxd.manager.doctor.gate).
    box.doctor.begin()
    watchdog = asyncio.create_task(_keep_watchdog_fed(notifier))
    stopped = asyncio.create_task(until_stopped())
    cut_off = asyncio.create_task(bus.wait_for_disconnect())  # type: ignore[no-untyped-call]
    await asyncio.wait((stopped, cut_off), return_when=asyncio.FIRST_COMPLETED)
    notifier.notify("STOPPING=1")
    watchdog.cancel()
    if not stopped.done():
        # A manager off the bus answers no one: exit, and systemd starts it again.
        await store.close()
        die(Problem.FAILED, "boxd lost its connection to the system bus; it exits to restart")
    stopped.cancel()
    cut_off.cancel()
    bus.disconnect()
    await store.close()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(run())
    except RecordTooNew as refused:
        # Said to the journal (systemctl status shows it) and as the unit's status line.
        log.error("%s", refused)
        sdnotify.SystemdNotifier().notify(f"STATUS={refused}")
        sys.exit(TOO_NEW_EXIT)
