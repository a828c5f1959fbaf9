"""The manager's side of systemd's D-Bus API: start and stop units, transient workers, and
signals when a unit changes state. Units are followed by signals, never by polling; a signal is
believed only from the connection that owns org.freedesktop.systemd1, since anyone may send a
systemd-looking JobRemoved or PropertiesChanged straight to boxd."""

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from boxd.dbus.bus_daemon import add_match
from boxd.dbus.name_owner import NameOwner
from boxd.errors import Problem, die

_SYSTEMD = "org.freedesktop.systemd1"
_MANAGER_PATH = "/org/freedesktop/systemd1"
_MANAGER = "org.freedesktop.systemd1.Manager"
_UNIT = "org.freedesktop.systemd1.Unit"
_SERVICE = "org.freedesktop.systemd1.Service"
_PROPERTIES = "org.freedesktop.DBus.Properties"
UNIT_PATH_PREFIX = "/org/freedesktop/systemd1/unit/"
# JobRemoved can arrive before the caller starts waiting; remember that many finished jobs.
_REMEMBERED_JOBS = 256
JOB_TIMEOUT_SECONDS = 120.0
# ExecMainCode: the si_code of the main process's end (waitid(2)).
CLD_EXITED, CLD_KILLED, CLD_DUMPED = 1, 2, 3
# The Service properties that say how the main process ended; systemd announces their changes.
_EXIT_PROPERTIES = ("Result", "ExecMainCode", "ExecMainStatus")


def unit_path(name: str) -> str:
    """systemd's object path for a unit: every byte outside [A-Za-z0-9] becomes _XX."""
    return UNIT_PATH_PREFIX + "".join(
        c if c.isascii() and c.isalnum() else f"_{ord(c):02x}" for c in name
    )


@dataclass(frozen=True)
class UnitStatus:
    active_state: str
    sub_state: str
    result: str
    main_code: int
    main_status: int
    # A job still queued for the unit: StartTransientUnit answers once the start job is queued,
    # and until systemd runs it the unit is `inactive`, as if it had already ended.
    job_pending: bool = False

    @property
    def finished(self) -> bool:
        if self.job_pending:
            return False
        return self.active_state in ("failed", "inactive") or (
            self.active_state == "active" and self.sub_state == "exited"
        )

    @property
    def succeeded(self) -> bool:
        """The program ran and exited 0. Judged by its exit, never by the active state: a
        worker that exits before its start job completes lands `inactive` in spite of
        RemainAfterExit, with the same clean exit."""
        return (
            self.finished
            and self.result == "success"
            and self.main_code == CLD_EXITED
            and self.main_status == 0
        )


def may_have_ended(interface: str, changed: dict[str, Variant]) -> bool:
    """Whether a watched unit's change may be its end, and so worth reading its state for (those
    who watch act on ends only). A worker's start announces half a dozen changes, and reading
    the unit for each took four calls, in the manager and in systemd, while the task's broker
    and worker were starting beside them. A signal that does not carry the values is read."""
    if interface == _UNIT:
        active, sub = changed.get("ActiveState"), changed.get("SubState")
        if active is None or sub is None:
            return True
        state: tuple[object, object] = (active.value, sub.value)
        return state[0] in ("inactive", "failed") or state == ("active", "exited")
    code, result = changed.get("ExecMainCode"), changed.get("Result")
    if code is None or result is None:
        return True
    # ExecMainCode stays 0 until the main process has ended.
    ended: bool = code.value != 0 or result.value != "success"
    return ended


class Systemd:
    def __init__(self, bus: MessageBus) -> None:
        self._bus = bus
        self._systemd = NameOwner(bus, _SYSTEMD)
        self._watched: dict[str, Callable[[], None]] = {}
        self._waiting: dict[str, asyncio.Future[str]] = {}
        self._finished: OrderedDict[str, str] = OrderedDict()
        # How each watched unit's main process ended, as systemd announced it: a unit that lands
        # inactive (a worker that exits before its start job completes does, in spite of
        # RemainAfterExit) is garbage-collected at once, and reading it afterwards finds a
        # fresh, never-run unit of the same name.
        self._exits: dict[str, dict[str, Any]] = {}
        # How many times systemd has begun to reload its units (daemon-reload) in this run: a
        # unit's process started before runs with the unit as it was (its Environment=, ...).
        self.reloads = 0
        # Called as systemd ends each reload: what was started before may be stale.
        self.reloaded: Callable[[], None] = lambda: None
        bus.add_message_handler(self._on_message)

    async def _call(
        self,
        path: str,
        interface: str,
        member: str,
        signature: str = "",
        body: list[Any] | None = None,
    ) -> Message:
        if not self._bus.connected:
            # dbus-fast never answers a call made once the bus is closed, not even with an
            # error: the `finally` of a doctor's probe cut off as boxd stops (run_to_end) waited
            # for ever, and systemd killed boxd after TimeoutStopSec, 90 s into every such stop.
            # EOFError, as dbus-fast fails a call the close cut off (callers take it so).
            raise EOFError(f"boxd is off the system bus, so systemd was not asked {member}")
        reply = await self._bus.call(
            Message(
                destination=_SYSTEMD,
                path=path,
                interface=interface,
                member=member,
                signature=signature,
                body=body or [],
            )
        )
        if reply is None:
            die(Problem.FAILED, f"systemd gave no answer to {member}")
        if reply.message_type == MessageType.ERROR:
            text = reply.body[0] if reply.body else reply.error_name
            raise SystemdError(reply.error_name or "", f"systemd refused {member}: {text}")
        return reply

    async def subscribe(self) -> None:
        await self._systemd.start()
        rules = (
            f"type='signal',sender='{_SYSTEMD}',interface='{_PROPERTIES}',"
            f"member='PropertiesChanged',path_namespace='{_MANAGER_PATH}/unit'",
            f"type='signal',sender='{_SYSTEMD}',interface='{_MANAGER}',member='JobRemoved'",
            f"type='signal',sender='{_SYSTEMD}',interface='{_MANAGER}',member='Reloading'",
        )
        for rule in rules:
            await add_match(self._bus, rule)
        await self._call(_MANAGER_PATH, _MANAGER, "Subscribe")

    def watch(self, name: str, changed: Callable[[], None]) -> None:
        """Calls `changed` whenever the unit's state may have changed. Set it up before the
        unit starts, so no change is missed."""
        self._watched[unit_path(name)] = changed

    def unwatch(self, name: str) -> None:
        self._watched.pop(unit_path(name), None)
        self._exits.pop(unit_path(name), None)

    def _on_message(self, message: Message) -> bool | None:
        if message.message_type != MessageType.SIGNAL or not self._systemd.sent(message):
            return None
        if (
            message.member == "JobRemoved"
            and message.interface == _MANAGER
            and message.path == _MANAGER_PATH
            and message.signature == "uoss"
        ):
            _id, job, _unit, result = message.body
            waiting = self._waiting.pop(job, None)
            if waiting is not None and not waiting.done():
                waiting.set_result(result)
            else:
                self._finished[job] = result
                while len(self._finished) > _REMEMBERED_JOBS:
                    self._finished.popitem(last=False)
            return None
        if (
            message.member == "Reloading"
            and message.interface == _MANAGER
            and message.path == _MANAGER_PATH
            and message.signature == "b"
        ):
            self.reloads += 1
            # Its argument: True as a reload begins, False as it ends.
            if message.body == [False]:
                self.reloaded()
            return None
        if (
            message.member == "PropertiesChanged"
            and message.interface == _PROPERTIES
            and message.path in self._watched
            and message.signature == "sa{sv}as"
            and message.body[0] in (_UNIT, _SERVICE)
        ):
            if message.body[0] == _SERVICE:
                exit = self._exits.setdefault(message.path, {})
                for name in _EXIT_PROPERTIES:
                    if name in message.body[1]:
                        exit[name] = message.body[1][name].value
            if may_have_ended(message.body[0], message.body[1]):
                self._watched[message.path]()
        return None

    async def start_unit(self, name: str) -> None:
        await self._call(_MANAGER_PATH, _MANAGER, "StartUnit", "ss", [name, "replace"])

    async def stop_unit(self, name: str) -> None:
        """Stops the unit and returns once it has stopped."""
        try:
            reply = await self._call(_MANAGER_PATH, _MANAGER, "StopUnit", "ss", [name, "replace"])
        except SystemdError as error:
            if not error.no_such_unit:
                raise
            return
        await self._job_done(reply.body[0])

    async def _job_done(self, job: str) -> str:
        if job in self._finished:
            return self._finished.pop(job)
        waiting = asyncio.get_running_loop().create_future()
        self._waiting[job] = waiting
        try:
            return await asyncio.wait_for(waiting, JOB_TIMEOUT_SECONDS)
        finally:
            self._waiting.pop(job, None)

    async def reset_failed(self, name: str) -> None:
        try:
            await self._call(_MANAGER_PATH, _MANAGER, "ResetFailedUnit", "s", [name])
        except SystemdError as error:
            if not error.no_such_unit:
                raise

    async def start_transient(self, name: str, properties: list[tuple[str, Variant]]) -> None:
        await self._call(
            _MANAGER_PATH,
            _MANAGER,
            "StartTransientUnit",
            "ssa(sv)a(sa(sv))",
            [name, "fail", [list(p) for p in properties], []],
        )

    async def run_to_end(self, name: str, properties: list[tuple[str, Variant]]) -> UnitStatus:
        """Runs a transient oneshot unit to its end and returns how its process ended, then
        stops it so that nothing of it stays loaded. `properties` say what it runs; the unit is
        a oneshot kept once exited, so that its exit can be read."""
        kept = [("Type", Variant("s", "oneshot")), ("RemainAfterExit", Variant("b", True))]
        reply = await self._call(
            _MANAGER_PATH,
            _MANAGER,
            "StartTransientUnit",
            "ssa(sv)a(sa(sv))",
            [name, "fail", [list(p) for p in [*kept, *properties]], []],
        )
        try:
            await self._job_done(reply.body[0])
            status = await self.status(name)
        finally:
            await self.stop_unit(name)
            await self.reset_failed(name)
        if status is None:
            die(Problem.FAILED, f"systemd forgot unit {name} before boxd could read its end")
        return status

    async def version(self) -> str:
        """systemd's version, as `systemctl --version` gives it: "252.39-1~deb12u2"."""
        reply = await self._call(_MANAGER_PATH, _PROPERTIES, "Get", "ss", [_MANAGER, "Version"])
        return str(reply.body[0].value)

    async def set_properties(self, name: str, properties: list[tuple[str, Variant]]) -> None:
        """Sets unit properties until the next boot (`systemctl set-property --runtime`)."""
        await self._call(
            _MANAGER_PATH,
            _MANAGER,
            "SetUnitProperties",
            "sba(sv)",
            [name, True, [list(p) for p in properties]],
        )

    async def status(self, name: str) -> UnitStatus | None:
        """The unit's state, or None when systemd has no such unit loaded and never told how
        it ended."""
        path = unit_path(name)
        try:
            await self._call(_MANAGER_PATH, _MANAGER, "GetUnit", "s", [name])
        except SystemdError as error:
            if error.no_such_unit:
                return self._collected(path)
            raise
        # Two calls are not one snapshot: the exit read between two identical readings of the
        # unit's state belongs to that state, since systemd sets them in the same step. And a
        # unit collected meanwhile reads, by its path, as a new unit of the same name that
        # never ran and is not loaded (a transient unit has no file).
        before = await self._unit_state(path)
        while True:
            service = (await self._call(path, _PROPERTIES, "GetAll", "s", [_SERVICE])).body[0]
            after = await self._unit_state(path)
            if after[0] != "loaded":
                return self._collected(path)
            if after == before:
                break
            before = after
        _load, active, sub, job = after
        return UnitStatus(
            active_state=active,
            sub_state=sub,
            result=service["Result"].value,
            main_code=service["ExecMainCode"].value,
            main_status=service["ExecMainStatus"].value,
            job_pending=job != 0,
        )

    async def _unit_state(self, path: str) -> tuple[str, str, str, int]:
        unit = (await self._call(path, _PROPERTIES, "GetAll", "s", [_UNIT])).body[0]
        return (
            unit["LoadState"].value,
            unit["ActiveState"].value,
            unit["SubState"].value,
            unit["Job"].value[0],
        )

    def _collected(self, path: str) -> UnitStatus | None:
        exit = self._exits.get(path, {})
        if not all(name in exit for name in _EXIT_PROPERTIES):
            return None
        return UnitStatus(
            active_state="inactive",
            sub_state="dead",
            result=exit["Result"],
            main_code=exit["ExecMainCode"],
            main_status=exit["ExecMainStatus"],
        )

    async def main_pid(self, name: str) -> int | None:
        """The unit's main process, or None when it has none or systemd has no such unit."""
        try:
            reply = await self._call(_MANAGER_PATH, _MANAGER, "GetUnit", "s", [name])
            pid = await self._call(reply.body[0], _PROPERTIES, "Get", "ss", [_SERVICE, "MainPID"])
        except SystemdError as error:
            if error.no_such_unit:
                return None
            raise
        value = pid.body[0].value
        return value if isinstance(value, int) and value > 0 else None

    async def signal_main(self, name: str, number: int) -> None:
        """Sends `number` to the unit's main process only (systemctl kill --kill-whom=main)."""
        await self._call(_MANAGER_PATH, _MANAGER, "KillUnit", "ssi", [name, "main", number])

    async def loaded_units(self, pattern: str) -> list[str]:
        """The names of the units loaded now whose names match the glob `pattern`."""
        reply = await self._call(
            _MANAGER_PATH, _MANAGER, "ListUnitsByPatterns", "asas", [[], [pattern]]
        )
        return [str(unit[0]) for unit in reply.body[0]]

    async def unit_of_pid(self, pid: int) -> str | None:
        try:
            reply = await self._call(_MANAGER_PATH, _MANAGER, "GetUnitByPID", "u", [pid])
        except SystemdError:
            return None
        path = reply.body[0]
        unit_id = await self._call(path, _PROPERTIES, "Get", "ss", [_UNIT, "Id"])
        value = unit_id.body[0].value
        return value if isinstance(value, str) else None


class SystemdError(Exception):
    def __init__(self, name: str, text: str) -> None:
        super().__init__(text)
        self.name = name

    @property
    def no_such_unit(self) -> bool:
        return self.name in (
            "org.freedesktop.systemd1.NoSuchUnit",
            "org.freedesktop.systemd1.LoadFailed",
        )
