"""Calls to the bus itself (org.freedesktop.DBus) that dbus-fast does not offer publicly."""

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from boxd.errors import Problem, die


async def _call(bus: MessageBus, member: str, argument: str) -> Message:
    reply = await bus.call(
        Message(
            destination="org.freedesktop.DBus",
            path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus",
            member=member,
            signature="s",
            body=[argument],
        )
    )
    if reply is None or reply.message_type == MessageType.ERROR:
        why = reply.body[0] if reply is not None and reply.body else "no answer"
        die(Problem.FAILED, f"the system bus refused {member}: {why}")
    return reply


async def add_match(bus: MessageBus, rule: str) -> None:
    """Asks the bus to deliver the signals the rule matches to this connection."""
    await _call(bus, "AddMatch", rule)


async def connection_uid(bus: MessageBus, name: str) -> int:
    """The user behind a bus name, as the bus daemon saw it connect."""
    uid = (await _call(bus, "GetConnectionUnixUser", name)).body[0]
    if not isinstance(uid, int):
        die(Problem.FAILED, f"the system bus gave no user for {name}")
    return uid


async def connection_pid(bus: MessageBus, name: str) -> int:
    """The process behind a bus name, as the bus daemon saw it connect."""
    pid = (await _call(bus, "GetConnectionUnixProcessID", name)).body[0]
    if not isinstance(pid, int):
        die(Problem.FAILED, f"the system bus gave no process for {name}")
    return pid
