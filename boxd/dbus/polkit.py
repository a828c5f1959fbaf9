"""Asks polkit whether the caller behind a bus name may manage the box.

The subject is the caller's bus name (`system-bus-name`), so polkit itself looks up who is
behind it: no uid or pid that could be recycled passes through our hands.
"""

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from boxd.errors import Problem, die

_AUTHORITY = "org.freedesktop.PolicyKit1"
_AUTHORITY_PATH = "/org/freedesktop/PolicyKit1/Authority"
_AUTHORITY_INTERFACE = "org.freedesktop.PolicyKit1.Authority"


async def check_authorization(bus: MessageBus, sender: str, action: str) -> None:
    reply = await bus.call(
        Message(
            destination=_AUTHORITY,
            path=_AUTHORITY_PATH,
            interface=_AUTHORITY_INTERFACE,
            member="CheckAuthorization",
            signature="(sa{sv})sa{ss}us",
            body=[["system-bus-name", {"name": Variant("s", sender)}], action, {}, 0, ""],
        )
    )
    if reply is None or reply.message_type == MessageType.ERROR:
        reason = reply.body[0] if reply is not None and reply.body else "no answer"
        die(Problem.FAILED, f"polkit could not check this call ({reason}); is polkitd running?")
    authorized, _challenge, _details = reply.body[0]
    if not authorized:
        die(
            Problem.FORBIDDEN,
            "Only the box's owner may do this: the caller is not root and not in group "
            f"boxd-owner (polkit refused {action}).",
        )


async def installed_actions(bus: MessageBus) -> list[str]:
    """The ids of the actions polkit has read (`pkaction`): a BoxError in words when polkit
    does not answer."""
    reply = await bus.call(
        Message(
            destination=_AUTHORITY,
            path=_AUTHORITY_PATH,
            interface=_AUTHORITY_INTERFACE,
            member="EnumerateActions",
            signature="s",
            body=[""],
        )
    )
    if reply is None or reply.message_type == MessageType.ERROR:
        reason = reply.body[0] if reply is not None and reply.body else "no answer"
        die(Problem.UNAVAILABLE, f"polkit does not answer on the system bus ({reason})")
    return [str(action[0]) for action in reply.body[0]]
