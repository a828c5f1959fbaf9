"""The manager's messages of one turn of the loop leave in one write, in the order made
(boxd.patches.dbus_fast); large ones across many writes are covered in test_patient_writes."""

import asyncio
from typing import Any

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from boxd.patches.dbus_fast import gathered, patient
from tests.support.dbus_daemon import bus_address

__all__ = ["bus_address"]


class CountingSocket:
    """The bus's socket, counting the writes made on it."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.writes = 0

    def send(self, *args: Any) -> Any:
        self.writes += 1
        return self._sock.send(*args)

    def sendmsg(self, *args: Any) -> Any:
        self.writes += 1
        return self._sock.sendmsg(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


async def listening(bus_address: str) -> tuple[MessageBus, asyncio.Queue[str]]:
    listener = await MessageBus(bus_address=bus_address).connect()
    heard: asyncio.Queue[str] = asyncio.Queue()

    def on_message(message: Message) -> None:
        if message.message_type == MessageType.SIGNAL and message.member == "Said":
            heard.put_nowait(message.body[0])

    listener.add_message_handler(on_message)
    rule = "type='signal',interface='org.t.T',member='Said'"
    await listener.call(
        Message(
            destination="org.freedesktop.DBus",
            path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus",
            member="AddMatch",
            signature="s",
            body=[rule],
        )
    )
    return listener, heard


async def test_one_turns_messages_leave_in_one_write_in_order(bus_address: str) -> None:
    listener, heard = await listening(bus_address)
    speaker = gathered(patient(await MessageBus(bus_address=bus_address).connect()))
    writer = speaker._writer
    assert writer is not None
    counting = CountingSocket(writer.sock)
    writer.sock = counting  # type: ignore[assignment]
    sent = [
        speaker.send(Message.new_signal("/o", "org.t.T", "Said", "s", [f"line {number}"]))
        for number in range(60)
    ]
    await asyncio.wait_for(asyncio.gather(*sent), 20)
    assert counting.writes == 1
    said = [await asyncio.wait_for(heard.get(), 20) for _ in range(60)]
    assert said == [f"line {number}" for number in range(60)]
    # A later turn's messages are written too, after the first turn's.
    await asyncio.wait_for(
        speaker.send(Message.new_signal("/o", "org.t.T", "Said", "s", ["later"])), 20
    )
    assert await asyncio.wait_for(heard.get(), 20) == "later"
    assert counting.writes == 2
    speaker.disconnect()
    listener.disconnect()


async def test_a_call_and_its_reply_go_through(bus_address: str) -> None:
    server = gathered(patient(await MessageBus(bus_address=bus_address).connect()))
    client = gathered(patient(await MessageBus(bus_address=bus_address).connect()))

    def on_call(message: Message) -> Message | None:
        if message.message_type != MessageType.METHOD_CALL or message.member != "Echo":
            return None
        return Message.new_method_return(message, "s", [message.body[0]])

    server.add_message_handler(on_call)
    call = Message(
        destination=server.unique_name,
        path="/o",
        interface="org.t.M",
        member="Echo",
        signature="s",
        body=["hello"],
    )
    reply = await asyncio.wait_for(client.call(call), 20)
    assert reply is not None and reply.body == ["hello"]
    server.disconnect()
    client.disconnect()
