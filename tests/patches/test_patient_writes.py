"""Large messages in a row must not cut a connection off the bus (boxd.patches.dbus_fast)."""

import asyncio
import json
import socket

import pytest
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from boxd.patches.dbus_fast import PatientSocket, gathered, patient
from tests.support.dbus_daemon import bus_address

__all__ = ["bus_address"]


def test_a_full_socket_sends_nothing_rather_than_failing() -> None:
    left, right = socket.socketpair()
    left.setblocking(False)
    with left, right:
        while True:
            try:
                left.send(b"x" * 65536)
            except BlockingIOError:
                break
        with pytest.raises(BlockingIOError):
            left.send(b"x")
        assert PatientSocket(left).send(b"x") == 0
        assert PatientSocket(left).fileno() == left.fileno()


@pytest.mark.parametrize("gather", [False, True])
async def test_megabyte_messages_back_to_back_keep_the_connection(
    bus_address: str, gather: bool
) -> None:
    server = patient(await MessageBus(bus_address=bus_address).connect())
    if gather:
        # The manager's bus: its messages wait for the end of the turn (gathered_writes).
        server = gathered(server)
    client = patient(await MessageBus(bus_address=bus_address).connect())
    big = "x" * 1_000_000

    def on_call(message: Message) -> bool | None:
        if message.message_type != MessageType.METHOD_CALL or message.member != "Log":
            return None

        async def answer() -> None:
            await asyncio.sleep(0.01)
            # A large signal and a large reply at once, as the manager sends for a step.
            server.send(Message.new_signal("/o", "org.t.T", "Event", "s", [big]))
            server.send(Message.new_method_return(message, "s", [json.dumps(message.body[0])]))

        asyncio.get_running_loop().create_task(answer())
        return True

    server.add_message_handler(on_call)

    async def log() -> None:
        call = Message(
            destination=server.unique_name,
            path="/o",
            interface="org.t.M",
            member="Log",
            signature="s",
            body=[big],
        )
        reply = await asyncio.wait_for(client.call(call), 20)
        assert reply is not None and reply.message_type == MessageType.METHOD_RETURN

    for _ in range(10):
        await asyncio.gather(*(log() for _ in range(4)))
    assert server.connected and client.connected
    server.disconnect()
    client.disconnect()
