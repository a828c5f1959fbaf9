"""Waiting for the owner's answer, told by the task object's Event signal: believed only from
the connection that owns org.boxd.Box1 at that moment, since anyone may send a signal straight
to the broker, and boxd itself comes back under a new unique name when it restarts."""

import asyncio
import json
from typing import Any

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from boxd.approval import ApprovalState
from boxd.dbus.bus_daemon import add_match
from boxd.dbus.interface import BUS_NAME, TASK, task_path
from boxd.dbus.name_owner import NameOwner
from boxd.event import EventKind


class ApprovalWaiter:
    def __init__(self, bus: MessageBus, task_id: str) -> None:
        self._bus = bus
        self._path = task_path(task_id)
        self._boxd = NameOwner(bus, BUS_NAME)
        self._answers: dict[str, str] = {}
        self._waiting: dict[str, asyncio.Future[str]] = {}

    async def start(self) -> None:
        await self._boxd.start()
        self._bus.add_message_handler(self._on_message)
        # Approval events only (arg1, the kind): the bus does not wake the broker for each of
        # its task's steps, calls and costs, which it would only read to drop.
        await add_match(
            self._bus,
            f"type='signal',sender='{BUS_NAME}',path='{self._path}',interface='{TASK}',"
            f"member='Event',arg1='{EventKind.APPROVAL.value}'",
        )

    def _on_message(self, message: Message) -> None:
        if (
            message.message_type != MessageType.SIGNAL
            or not self._boxd.sent(message)
            or message.path != self._path
            or message.interface != TASK
            or message.member != "Event"
            or message.signature != "tss"
            or message.body[1] != EventKind.APPROVAL
        ):
            return
        data = json.loads(message.body[2])["data"]
        if data.get("state") == ApprovalState.PENDING:
            return
        # Remembered, since the answer can come before anyone starts waiting for it.
        self._answers[data["id"]] = data["state"]
        waiting = self._waiting.pop(data["id"], None)
        if waiting is not None and not waiting.done():
            waiting.set_result(data["state"])

    async def wait(self, approval: dict[str, Any], seconds: float) -> str:
        """The approval's state once answered, or `pending` when `seconds` pass first."""
        if approval["state"] != ApprovalState.PENDING:
            return str(approval["state"])
        if approval["id"] in self._answers:
            return self._answers[approval["id"]]
        waiting = self._waiting.get(approval["id"])
        if waiting is None:
            waiting = asyncio.get_running_loop().create_future()
            self._waiting[approval["id"]] = waiting
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), seconds)
        except TimeoutError:
            return ApprovalState.PENDING.value
