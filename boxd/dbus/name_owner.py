"""Who owns a well-known bus name right now, so a signal is believed only from its owner.

Anyone on the bus may send a signal with a destination, and it reaches that connection whatever
its match rules say. What no one can forge is the sender: the bus daemon writes the sending
connection's unique name there. So a receiver acts on a signal only when its sender is the unique
name that owns the well-known name at that moment: asked once with GetNameOwner, then kept
current by NameOwnerChanged, which only the bus itself sends (sender `org.freedesktop.DBus`, a
name no connection can own). An owner that restarts comes back under a new unique name; the bus
tells us so before any signal of the new owner reaches us, since it queues both to our connection
in the order it handled them, and dbus-fast hands them to us in that order.
"""

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from boxd.dbus.bus_daemon import BUS_DAEMON, BUS_DAEMON_PATH, add_match, name_owner


class NameOwner:
    def __init__(self, bus: MessageBus, name: str) -> None:
        self.name = name
        self._bus = bus
        self._owner: str | None = None
        self._changes = 0

    @property
    def owner(self) -> str | None:
        """The owner's unique name, or None while no one owns the name (or before start)."""
        return self._owner

    async def start(self) -> None:
        """Follows the name from now on. Until this returns, no signal is believed."""
        self._bus.add_message_handler(self._on_message)
        await add_match(
            self._bus,
            f"type='signal',sender='{BUS_DAEMON}',path='{BUS_DAEMON_PATH}',"
            f"interface='{BUS_DAEMON}',member='NameOwnerChanged',arg0='{self.name}'",
        )
        # A change announced while GetNameOwner is on its way may be older or newer than its
        # answer, which cannot be told apart here; so ask again until none came in between.
        while True:
            seen = self._changes
            owner = await name_owner(self._bus, self.name)
            if seen == self._changes:
                self._owner = owner
                return

    def sent(self, message: Message) -> bool:
        """Whether the message comes from the name's owner as it stands now."""
        return self._owner is not None and message.sender == self._owner

    def _on_message(self, message: Message) -> None:
        if (
            message.message_type == MessageType.SIGNAL
            and message.sender == BUS_DAEMON
            and message.path == BUS_DAEMON_PATH
            and message.interface == BUS_DAEMON
            and message.member == "NameOwnerChanged"
            and message.signature == "sss"
            and message.body[0] == self.name
        ):
            self._owner = message.body[2] or None
            self._changes += 1
