"""Asks polkit whether the caller behind a bus name may manage the box.

The subject is the caller's bus name (`system-bus-name`), so polkit itself looks up who is
behind it: no uid or pid that could be recycled passes through our hands.
"""

from collections.abc import Callable
from typing import Any

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from boxd.errors import Problem, die

_AUTHORITY = "org.freedesktop.PolicyKit1"
_AUTHORITY_PATH = "/org/freedesktop/PolicyKit1/Authority"
_AUTHORITY_INTERFACE = "org.freedesktop.PolicyKit1.Authority"


async def _ask(
    bus: MessageBus,
    member: str,
    signature: str,
    body: list[Any],
    problem: Problem,
    unanswered: Callable[[str], str],
) -> Any:
    """What polkit's Authority answers `member`; when it answers an error or nothing, a
    BoxError of `problem` in the words `unanswered` makes of the reason."""
    reply = await bus.call(
        Message(
            destination=_AUTHORITY,
            path=_AUTHORITY_PATH,
            interface=_AUTHORITY_INTERFACE,
            member=member,
            signature=signature,
            body=body,
        )
    )
    if reply is None or reply.message_type == MessageType.ERROR:
        reason = reply.body[0] if reply is not None and reply.body else "no answer"
        die(problem, unanswered(str(reason)))
    return reply.body[0]


async def check_authorization(bus: MessageBus, sender: str, action: str) -> None:
    authorized, _challenge, _details = await _ask(
        bus,
        "CheckAuthorization",
        "(sa{sv})sa{ss}us",
        [["system-bus-name", {"name": Variant("s", sender)}], action, {}, 0, ""],
        Problem.FAILED,
        lambda reason: f"polkit could not check this call ({reason}); is polkitd running?",
    )
    if not authorized:
        die(
            Problem.FORBIDDEN,
            "Only the box's owner may do this: the caller is not root and not in group "
            f"boxd-owner (polkit refused {action}).",
        )


async def installed_actions(bus: MessageBus) -> list[str]:
    """The ids of the actions polkit has read (`pkaction`): a BoxError in words when polkit
    does not answer."""
    actions = await _ask(
        bus,
        "EnumerateActions",
        "s",
        [""],
        Problem.UNAVAILABLE,
        lambda reason: f"polkit does not answer on the system bus ({reason})",
    )
    return [str(action[0]) for action in actions]
