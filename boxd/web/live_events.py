"""boxd's D-Bus signals as the screen's live events: one subscription to the bus for the whole
gateway, fanned out to every open stream (`GET /api/events`, boxd.web.event_stream).

The subscription (a match rule) is held only while a stream is open: every step of every task
sends two signals, and with the rule held for good the bus daemon sent both to the gateway, which
woke up to read them and drop them, whether or not any page was showing.

A signal is believed only from the unique name that owns org.boxd.Box1 (boxd.dbus.name_owner):
anyone on the bus may send one straight to the gateway's connection, whatever its match rules.
Each stream has a bounded queue; a stream that cannot keep up is dropped, never buffered without
end, so one stalled browser costs the gateway no more than its queue.
"""

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from boxd.dbus.bus_daemon import add_match, remove_match
from boxd.dbus.interface import APPROVAL_ASKED, BUS_NAME, MANAGER, ROOT_PATH, TASK, TASKS_PATH
from boxd.dbus.name_owner import NameOwner
from boxd.errors import Problem, die

# Each stream is a connection held open and a queue: the cap keeps a page opened in many tabs,
# or a device reconnecting in a loop, from holding the gateway's memory and file descriptors.
MAX_STREAMS = 32
# Messages a stream may have waiting; far more than a busy box sends while a browser reads.
QUEUE_LENGTH = 256
TOO_MANY = (
    f"{MAX_STREAMS} live event streams are open already, the most the box keeps: "
    "close the screen in another tab or on another device, then reload"
)
# boxd's signals: its tasks' and its own (APPROVAL_ASKED).
RULE = f"type='signal',sender='{BUS_NAME}',path_namespace='{ROOT_PATH}'"
_PROPERTIES = "org.freedesktop.DBus.Properties"
_OBJECT_MANAGER = "org.freedesktop.DBus.ObjectManager"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveEvent:
    """One Server-Sent Event: its name and its data, JSON text."""

    name: str
    data: str


def _task_id(path: str | None) -> str | None:
    prefix = f"{TASKS_PATH}/"
    if path is None or not path.startswith(prefix):
        return None
    task_id = path.removeprefix(prefix)
    return task_id if task_id and "/" not in task_id else None


def _values(properties: dict[str, Variant]) -> dict[str, Any]:
    return {name: variant.value for name, variant in properties.items()}


def translate(message: Message) -> LiveEvent | None:
    """The live event a signal of boxd's makes, or None for any other signal."""
    if message.message_type != MessageType.SIGNAL:
        return None
    if (
        message.path == ROOT_PATH
        and message.interface == MANAGER
        and message.member == APPROVAL_ASKED
        and message.signature == "s"
    ):
        return LiveEvent("approval", message.body[0])
    task_id = _task_id(message.path)
    if task_id is None:
        return None
    if message.interface == TASK and message.member == "Event" and message.signature == "tss":
        event = json.loads(message.body[2])
        return LiveEvent("step", json.dumps({"task": task_id, "event": event}))
    if (
        message.interface == _PROPERTIES
        and message.member == "PropertiesChanged"
        and message.signature == "sa{sv}as"
        and message.body[0] == TASK
    ):
        changed = _values(message.body[1])
        return LiveEvent("task", json.dumps({"task": task_id, "changed": changed}))
    # Exporting a task's object announces it with all its properties: a new task (or, when boxd
    # starts, each task it knows, which a page takes as a cue to refresh).
    if (
        message.interface == _OBJECT_MANAGER
        and message.member == "InterfacesAdded"
        and message.signature == "oa{sa{sv}}"
        and message.body[0] == message.path
        and TASK in message.body[1]
    ):
        changed = _values(message.body[1][TASK])
        return LiveEvent("task", json.dumps({"task": task_id, "new": True, "changed": changed}))
    return None


class Subscription:
    """One stream's queue. Overflowing drops the stream: `on_drop` ends its connection, which
    also frees a handler blocked writing to a client that stopped reading."""

    def __init__(self, on_drop: Callable[[], None], length: int) -> None:
        self.queue: asyncio.Queue[LiveEvent] = asyncio.Queue(maxsize=length)
        self.dropped = False
        self._on_drop = on_drop

    def offer(self, event: LiveEvent) -> None:
        if self.dropped:
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped = True
            self._on_drop()


class LiveEvents:
    def __init__(self, max_streams: int = MAX_STREAMS, queue_length: int = QUEUE_LENGTH) -> None:
        self._max_streams = max_streams
        self._queue_length = queue_length
        self._streams: set[Subscription] = set()
        self._boxd: NameOwner | None = None
        self._bus: MessageBus | None = None
        # Whether the bus holds RULE for this connection now.
        self._listening = False
        # One AddMatch or RemoveMatch at a time, so the rule follows the streams in order.
        self._rule_turn = asyncio.Lock()
        self._dropping: set[asyncio.Task[None]] = set()

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    async def start(self, bus: MessageBus) -> None:
        """Follows the owner of boxd's name from now on; its signals come once a stream opens."""
        boxd = NameOwner(bus, BUS_NAME)
        await boxd.start()
        bus.add_message_handler(self._on_message)
        self._bus = bus
        self._boxd = boxd

    async def subscribe(self, on_drop: Callable[[], None]) -> Subscription:
        """A new stream's queue, returned once the bus sends boxd's signals here: whatever boxd
        does after that reaches it."""
        if len(self._streams) >= self._max_streams:
            die(Problem.UNAVAILABLE, TOO_MANY)
        subscription = Subscription(on_drop, self._queue_length)
        self._streams.add(subscription)
        try:
            # Shielded: a caller that goes away while the bus is asked does not leave the rule
            # held (or dropped) behind the gateway's back; the change ends, and is recorded.
            await asyncio.shield(self._follow_streams())
        except BaseException:
            self.unsubscribe(subscription)
            raise
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self._streams.discard(subscription)
        if not self._streams:
            # The last stream closed: the rule goes, unless one opens before its turn comes. Asked
            # even while the rule seems not held, as an AddMatch may still be on its way.
            drop = asyncio.get_running_loop().create_task(self._follow_streams())
            self._dropping.add(drop)
            drop.add_done_callback(self._dropped)

    def _dropped(self, drop: "asyncio.Task[None]") -> None:
        self._dropping.discard(drop)
        if not drop.cancelled() and drop.exception() is not None:
            log.warning("could not stop listening to boxd's signals: %s", drop.exception())

    async def _follow_streams(self) -> None:
        """Holds RULE while a stream is open, and not while none is."""
        async with self._rule_turn:
            wanted = bool(self._streams)
            if self._bus is None or wanted == self._listening:
                return
            if wanted:
                await add_match(self._bus, RULE)
            else:
                await remove_match(self._bus, RULE)
            self._listening = wanted

    def _on_message(self, message: Message) -> None:
        # Returns None always: the signal may matter to other handlers too. A signal that comes
        # with no stream open (the rule was on its way out) is not read.
        if not self._streams or self._boxd is None or not self._boxd.sent(message):
            return
        try:
            event = translate(message)
        except ValueError:
            return  # not JSON: nothing a page could read
        if event is None:
            return
        for subscription in list(self._streams):
            subscription.offer(event)
