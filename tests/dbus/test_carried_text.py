"""What a caller wrote reaches D-Bus whole or with U+FFFD for what D-Bus cannot carry, never as
a message that fails to marshal: a NUL in a step's text (a task's to write) made its
PropertiesChanged unsendable and, at the next start, the manager's export of the task fail, so
boxd restarted for good; a key given twice named raw in a refusal made its error reply unsendable,
and the caller waited for the call's time-out. On a real dbus-daemon."""

import asyncio
import json

import pytest
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from boxd.dbus.carried_text import carried
from boxd.dbus.interface import BUS_NAME, CREATE_TASK, MANAGER, ROOT_PATH, TASK, Bound, task_path
from boxd.dbus.server import Server
from boxd.dbus.task_object import TaskObject
from boxd.reading.strict_json import loads
from boxd.wire.caller import Caller, Role
from tests.support.dbus_daemon import bus_address
from tests.support.tasks import a_task

__all__ = ["bus_address"]


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain", "plain"),
        ("naïve ✓", "naïve ✓"),
        ("a\0b", "a\ufffdb"),
        ("a\ud800b\udfff", "a\ufffdb\ufffd"),
        ("\0\ud83d\ude00", "\ufffd\ufffd\ufffd"),
    ],
)
def test_what_d_bus_cannot_carry_shows_as_the_replacement_character(text: str, shown: str) -> None:
    assert carried(text) == shown
    carried(text).encode()


async def test_a_step_with_a_nul_is_exported_and_changed_on_the_bus(bus_address: str) -> None:
    serving = await MessageBus(bus_address=bus_address).connect()
    asking = await MessageBus(bus_address=bus_address).connect()
    try:
        task = a_task().model_copy(update={"title": "t\0itle", "step": "a\0b"})
        exported = TaskObject(task)
        serving.export(task_path(task.id), exported)
        exported.update(task.model_copy(update={"step": "c\0d", "error": "e\0"}))
        reply = await asyncio.wait_for(
            asking.call(
                Message(
                    destination=serving.unique_name,
                    path=task_path(task.id),
                    interface="org.freedesktop.DBus.Properties",
                    member="GetAll",
                    signature="s",
                    body=[TASK],
                )
            ),
            10,
        )
        assert reply is not None and reply.message_type == MessageType.METHOD_RETURN
        properties = {name: variant.value for name, variant in reply.body[0].items()}
        assert properties["Title"] == "t\ufffditle"
        assert properties["Step"] == "c\ufffdd"
        assert properties["Error"] == "e\ufffd"
    finally:
        serving.disconnect()
        asking.disconnect()


@pytest.mark.parametrize(
    "body",
    ['{"a\\u0000": 1, "a\\u0000": 2}', '{"\\ud800": 1, "\\ud800": 2}', '{"\\ud800": 1e999}'],
)
async def test_a_refusal_that_quotes_the_caller_is_answered(bus_address: str, body: str) -> None:
    serving = await MessageBus(bus_address=bus_address).connect()
    asking = await MessageBus(bus_address=bus_address).connect()
    try:

        async def authorize(message: Message, method: Bound) -> Caller:
            return Caller(Role.OWNER, message.sender or "")

        async def create(caller: Caller, request: str) -> object:
            return loads(request)

        server = Server(serving, authorize)
        server.handle(CREATE_TASK, create)
        reply = await asyncio.wait_for(
            asking.call(
                Message(
                    destination=serving.unique_name,
                    path=ROOT_PATH,
                    interface=MANAGER,
                    member=CREATE_TASK.name,
                    signature="s",
                    body=[body],
                )
            ),
            10,
        )
        assert reply is not None and reply.message_type == MessageType.ERROR
        assert reply.error_name == f"{BUS_NAME}.Error.Invalid"
        assert "\ufffd" in reply.body[0]
        json.dumps(reply.body[0])
    finally:
        serving.disconnect()
        asking.disconnect()
