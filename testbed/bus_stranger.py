"""A local user with no rights on the box, on the system bus: run inside a test machine with
boxd's venv python, as `nobody` (`python -c <this file> forge|listen ...`).

    forge TO PATH INTERFACE MEMBER SIGNATURE BODY
        Sends one signal straight to a connection, as `dbus-send --type=signal --dest=` does.
        TO is `owner:<well-known name>` or `pid:<process id>` (the connection of that process,
        found as any user can: ListNames, GetConnectionUnixProcessID). BODY is a JSON list.
        Returns once the bus daemon has routed it: it handles one connection's messages in
        order, so its answer to a later call means the signal is already on its way.
    flood TO COUNT
        Sends COUNT signals carrying a file descriptor (of /dev/null) straight to TO's
        connection, and as many calls of the box's methods with one attached (the wrong
        arguments, or a method that takes none), then answers once the bus has routed them all.
    listen
        Asks for every signal there is, broadcast or eavesdropped, and prints each one, after a
        first line `listening` once the bus has answered its match rules. Told to stop
        (SIGTERM), it asks the bus one more thing and prints `heard all` once answered: every
        signal the bus routed to it before is printed by then.
"""

import asyncio
import json
import os
import signal
import sys
from typing import Any

from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus

BUS = "org.freedesktop.DBus"
BUS_PATH = "/org/freedesktop/DBus"


async def bus_call(bus: MessageBus, member: str, signature: str = "", *args: Any) -> Any:
    reply = await bus.call(
        Message(
            destination=BUS,
            path=BUS_PATH,
            interface=BUS,
            member=member,
            signature=signature,
            body=list(args),
        )
    )
    if reply is None or reply.message_type == MessageType.ERROR:
        sys.exit(f"the bus refused {member}: {reply.body if reply else 'no answer'}")
    return reply.body[0] if reply.body else None


async def destination(bus: MessageBus, to: str) -> str:
    kind, _, value = to.partition(":")
    if kind == "owner":
        return str(await bus_call(bus, "GetNameOwner", "s", value))
    for name in await bus_call(bus, "ListNames"):
        if name.startswith(":"):
            try:
                pid = await bus_call(bus, "GetConnectionUnixProcessID", "s", name)
            except SystemExit:
                continue
            if pid == int(value):
                return str(name)
    sys.exit(f"no connection of process {value} on the bus")


async def forge(to: str, path: str, interface: str, member: str, sig: str, body: str) -> None:
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    target = await destination(bus, to)
    bus.send(
        Message(
            message_type=MessageType.SIGNAL,
            destination=target,
            path=path,
            interface=interface,
            member=member,
            signature=sig,
            body=json.loads(body),
        )
    )
    await bus_call(bus, "GetId")
    print(target, flush=True)
    bus.disconnect()


async def flood(to: str, count: str) -> None:
    bus = await MessageBus(bus_type=BusType.SYSTEM, negotiate_unix_fd=True).connect()
    target = await destination(bus, to)
    fd = os.open("/dev/null", os.O_RDONLY)
    for number in range(int(count)):
        bus.send(
            Message(
                message_type=MessageType.SIGNAL,
                destination=target,
                path="/org/boxd/Box1",
                interface="org.example.Stranger",
                member="Leak",
                signature="h",
                body=[0],
                unix_fds=[fd],
            )
        )
        member, signature, body = (
            ("ListWorkspaces", "h", [0])
            if number % 2
            else ("OpenWorkspaceFile", "ssh", ["home", "x", 0])
        )
        bus.send(
            Message(
                destination=target,
                path="/org/boxd/Box1",
                interface="org.boxd.Box1.Manager",
                member=member,
                signature=signature,
                body=body,
                unix_fds=[fd],
            )
        )
        if number % 20 == 19:
            # Paced: the bus holds only so many descriptors in flight for one connection.
            await bus_call(bus, "GetId")
    await bus_call(bus, "GetId")
    print(target, flush=True)
    bus.disconnect()


async def listen() -> None:
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()

    def show(message: Message) -> None:
        if message.message_type == MessageType.SIGNAL:
            print(message.sender, message.path, message.member, message.body, flush=True)

    bus.add_message_handler(show)
    # dbus-daemon refuses eavesdropping rules to all but root (1.14); whatever it grants is used.
    for rule in ("type='signal'", "type='signal',sender='org.boxd.Box1'", "eavesdrop='true'"):
        reply = await bus.call(
            Message(
                destination=BUS,
                path=BUS_PATH,
                interface=BUS,
                member="AddMatch",
                signature="s",
                body=[rule],
            )
        )
        if reply is None or reply.message_type == MessageType.ERROR:
            print(f"AddMatch {rule} refused", file=sys.stderr, flush=True)
    print("listening", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await bus_call(bus, "GetId")
    print("heard all", flush=True)
    bus.disconnect()


if __name__ == "__main__":
    if sys.argv[1] == "forge":
        asyncio.run(forge(*sys.argv[2:8]))
    elif sys.argv[1] == "flood":
        asyncio.run(flood(*sys.argv[2:4]))
    else:
        asyncio.run(listen())
