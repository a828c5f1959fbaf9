"""Calls to the bus itself (org.freedesktop.DBus) that dbus-fast does not offer publicly."""

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from boxd.errors import Problem, die

# The bus itself: its name is also the interface of its calls and the sender of its signals,
# and no connection can own it.
BUS_DAEMON = "org.freedesktop.DBus"
BUS_DAEMON_PATH = "/org/freedesktop/DBus"
_NO_OWNER = "org.freedesktop.DBus.Error.NameHasNoOwner"


async def _ask(bus: MessageBus, member: str, argument: str) -> Message | None:
    return await bus.call(
        Message(
            destination=BUS_DAEMON,
            path=BUS_DAEMON_PATH,
            interface=BUS_DAEMON,
            member=member,
            signature="s",
            body=[argument],
        )
    )


def _answer(reply: Message | None, member: str) -> Message:
    if reply is None or reply.message_type == MessageType.ERROR:
        why = reply.body[0] if reply is not None and reply.body else "no answer"
        die(Problem.FAILED, f"the system bus refused {member}: {why}")
    return reply


async def _call(bus: MessageBus, member: str, argument: str) -> Message:
    return _answer(await _ask(bus, member, argument), member)


async def add_match(bus: MessageBus, rule: str) -> None:
    """Asks the bus to deliver the signals the rule matches to this connection."""
    await _call(bus, "AddMatch", rule)


async def remove_match(bus: MessageBus, rule: str) -> None:
    """Takes back a rule add_match gave, exactly as given."""
    await _call(bus, "RemoveMatch", rule)


async def name_owner(bus: MessageBus, name: str) -> str | None:
    """The unique name that owns `name` now, or None while no one does."""
    reply = await _ask(bus, "GetNameOwner", name)
    if reply is not None and reply.error_name == _NO_OWNER:
        return None
    owner = _answer(reply, "GetNameOwner").body[0]
    if not isinstance(owner, str):
        die(Problem.FAILED, f"the system bus gave no owner for {name}")
    return owner


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


async def bus_id(bus: MessageBus) -> str:
    """The bus's own id, new each time the bus starts (a reboot): a unique connection name is
    never given twice under one id."""
    reply = await bus.call(
        Message(destination=BUS_DAEMON, path=BUS_DAEMON_PATH, interface=BUS_DAEMON, member="GetId")
    )
    found = _answer(reply, "GetId").body[0]
    if not isinstance(found, str):
        die(Problem.FAILED, "the system bus gave no id")
    return found
