"""A stand-in for dbus-fast's MessageBus: the bus daemon's answers to AddMatch and GetNameOwner,
answers to boxd's own methods from a test's table, and messages handed to the handlers in order,
as the real bus does. The sender of each message is whatever the test says, which is exactly
what the real bus daemon would never let an attacker choose."""

import json
from collections.abc import Callable
from typing import Any, cast

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from boxd.dbus.bus_daemon import BUS_DAEMON, BUS_DAEMON_PATH
from boxd.dbus.interface import Method, find_method

Handler = Callable[[Message], Message | bool | None]


def signal(
    sender: str,
    path: str,
    interface: str,
    member: str,
    signature: str,
    body: list[Any],
    destination: str | None = None,
) -> Message:
    return Message(
        message_type=MessageType.SIGNAL,
        sender=sender,
        destination=destination,
        path=path,
        interface=interface,
        member=member,
        signature=signature,
        body=body,
    )


def owner_changed(name: str, old: str, new: str, sender: str = BUS_DAEMON) -> Message:
    return signal(sender, BUS_DAEMON_PATH, BUS_DAEMON, "NameOwnerChanged", "sss", [name, old, new])


def _reply(signature: str = "", body: list[Any] | None = None) -> Message:
    return Message(
        message_type=MessageType.METHOD_RETURN,
        reply_serial=1,
        sender=BUS_DAEMON,
        signature=signature,
        body=body or [],
    )


class FakeBus:
    def __init__(self, owners: dict[str, str]) -> None:
        self.owners = owners
        self.rules: list[str] = []
        self.name_owner_asked = 0
        # Called while a GetNameOwner is on its way, before it is answered.
        self.while_asking: Callable[[], None] = lambda: None
        # Answers to boxd's methods, as declared on the interface called: JSON, as boxd answers.
        self.answers: dict[Method, Any] = {}
        self._handlers: list[Handler] = []
        self.exported: list[str] = []

    @property
    def connected(self) -> bool:
        return True

    @property
    def bus(self) -> MessageBus:
        return cast(MessageBus, self)

    def export(self, path: str, interface: object) -> None:
        self.exported.append(path)

    def add_message_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    def deliver(self, message: Message) -> None:
        for handler in self._handlers:
            if handler(message):
                return

    async def call(self, message: Message) -> Message:
        if message.member == "AddMatch":
            self.rules.append(message.body[0])
            return _reply()
        if message.member == "RemoveMatch":
            self.rules.remove(message.body[0])
            return _reply()
        if message.member == "GetNameOwner":
            self.name_owner_asked += 1
            owner = self.owners.get(message.body[0])
            self.while_asking()
            if owner is None:
                return Message(
                    message_type=MessageType.ERROR,
                    reply_serial=1,
                    sender=BUS_DAEMON,
                    error_name="org.freedesktop.DBus.Error.NameHasNoOwner",
                    signature="s",
                    body=["no one owns it"],
                )
            return _reply("s", [owner])
        if message.member == "Subscribe":
            return _reply()
        bound = find_method(message.interface, message.member)
        assert bound is not None, f"boxd declares no {message.interface}.{message.member}"
        return _reply("s", [json.dumps(self.answers[bound.method])])
