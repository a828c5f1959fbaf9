"""`boxctl follow`: the task's steps live, from the task object's Event signal, until it ends.
Events are believed only from the connection that owns org.boxd.Box1 (boxd.dbus.name_owner)."""

import asyncio
import json
from collections.abc import Callable
from typing import Any

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from boxd.dbus import interface as api
from boxd.dbus.bus_daemon import add_match
from boxd.dbus.client import BoxClient, whole
from boxd.dbus.interface import BUS_NAME, TASK, task_path
from boxd.dbus.name_owner import NameOwner
from boxd.wire.models.task import TaskState

ENDED = {state.value for state in TaskState if state.ended}


async def follow(client: BoxClient, task_id: str, emit: Callable[[dict[str, Any]], None]) -> str:
    """Emits every step event (kind, seq, at, data) in order; returns the final state."""
    bus: MessageBus = client.bus
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    path = task_path(task_id)
    boxd = NameOwner(bus, BUS_NAME)
    await boxd.start()

    def on_signal(message: Message) -> None:
        if (
            message.message_type == MessageType.SIGNAL
            and boxd.sent(message)
            and message.path == path
            and message.interface == TASK
            and message.member == "Event"
            and message.signature == "tss"
        ):
            events.put_nowait(json.loads(message.body[2]))

    bus.add_message_handler(on_signal)
    # Subscribe before reading what is already logged, so nothing falls between the two.
    await add_match(bus, f"type='signal',sender='{BUS_NAME}',path='{path}',interface='{TASK}'")
    task = await whole(lambda page: client.call(api.GET_TASK, task_id, page), "steps")
    seen = 0
    for step in task["steps"]:
        emit({"kind": "task.step", "seq": step["seq"], "at": step["at"], "data": step})
        seen = step["seq"]
    state: str = task["state"]
    if state in ENDED:
        data = {"state": state, "error": task.get("error")}
        emit({"kind": "task.state", "seq": seen, "at": task.get("endedAt", 0), "data": data})
    while state not in ENDED:
        event = await events.get()
        if event["seq"] <= seen:
            continue
        seen = event["seq"]
        emit(event)
        if event["kind"] == "task.state":
            state = event["data"]["state"]
    return state
