"""File descriptors on a real dbus-daemon: a connection that negotiates them closes every one
that comes in (a stranger's signal, a call that takes none, a call of no method at all), keeps
the one a method declared `takes_fd` is called with until its handler returns, passes the one a
`passes_fd` handler opens and closes it once written, and a caller that gave up on such a reply
closes its descriptor when it comes."""

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from boxd.dbus import interface
from boxd.dbus.bus_daemon import bus_id
from boxd.dbus.client import BoxClient
from boxd.dbus.fd_reply import Opened
from boxd.dbus.incoming_fds import guarded
from boxd.dbus.interface import BUS_NAME, MANAGER, ROOT_PATH, Bound, Door, Method
from boxd.dbus.server import Server
from boxd.errors import Problem, die
from boxd.patches.dbus_fast import patient
from boxd.wire.caller import Caller, Role
from tests.support.dbus_daemon import bus_address

__all__ = ["bus_address"]

OWNER = frozenset({Door.POLKIT})
READ_FD = Method("ReadFd", ("name",), "read", OWNER, takes_fd=True)
OPEN_FD = Method("OpenFd", ("name",), "opened", OWNER, passes_fd=True)
PLAIN = Method("Plain", ("name",), "plain", OWNER)


@pytest.fixture
def declared(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    table = dict(interface._BOUND)
    for method in (READ_FD, OPEN_FD, PLAIN):
        table[(MANAGER, method.name)] = Bound(MANAGER, method)
    monkeypatch.setattr(interface, "_BOUND", table)
    yield


def open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


@dataclass
class Served:
    server: MessageBus
    caller: MessageBus
    client: BoxClient
    # What the handlers saw, and the descriptors they handed out.
    read: list[bytes]
    opened: list[int]
    release: asyncio.Event


@pytest.fixture
async def served(bus_address: str, declared: None, tmp_path: Path) -> AsyncIterator[Served]:
    server_bus = guarded(
        await MessageBus(bus_address=bus_address, negotiate_unix_fd=True).connect()
    )
    caller_bus = guarded(
        await MessageBus(bus_address=bus_address, negotiate_unix_fd=True).connect()
    )
    (tmp_path / "file").write_bytes(b"the file's bytes")
    served = Served(server_bus, caller_bus, BoxClient(caller_bus, MANAGER), [], [], asyncio.Event())

    async def authorize(message: Message, method: Bound) -> Caller:
        return Caller(Role.OWNER, message.sender or "")

    async def read_fd(caller: Caller, name: str, fd: int) -> str:
        served.read.append(os.pread(fd, 100, 0))
        await served.release.wait()
        return name

    async def open_fd(caller: Caller, name: str) -> Opened:
        if name == "refuse":
            die(Problem.FORBIDDEN, "refused")
        await served.release.wait()
        fd = os.open(tmp_path / "file", os.O_RDONLY)
        served.opened.append(fd)
        return Opened({"name": name}, fd)

    async def plain(caller: Caller, name: str) -> str:
        return name

    server = Server(server_bus, authorize)
    server.handle(READ_FD, read_fd)
    server.handle(OPEN_FD, open_fd)
    server.handle(PLAIN, plain)
    await server_bus.request_name(BUS_NAME)
    try:
        yield served
    finally:
        served.release.set()
        server_bus.disconnect()
        caller_bus.disconnect()


def fd_of(path: Path) -> int:
    return os.open(path, os.O_RDONLY)


async def send(bus: MessageBus, message: Message) -> None:
    await bus.send(message)


async def until(check: object, what: str) -> None:
    for _ in range(500):
        if callable(check) and check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_a_strangers_descriptors_are_closed_on_arrival(
    served: Served, bus_address: str, tmp_path: Path
) -> None:
    # Patient: it sends faster than the bus reads (boxd.patches.dbus_fast).
    stranger = patient(await MessageBus(bus_address=bus_address, negotiate_unix_fd=True).connect())
    try:
        await asyncio.sleep(0.1)
        before = open_fds()
        mine = fd_of(tmp_path / "file")
        messages = [
            Message.new_signal(ROOT_PATH, "org.example.X", "Sig", "h", [0], unix_fds=[mine]),
            Message(
                destination=served.server.unique_name,
                path=ROOT_PATH,
                interface=MANAGER,
                member=PLAIN.name,
                signature="sh",
                body=["x", 0],
                unix_fds=[mine],
            ),
            Message(
                destination=served.server.unique_name,
                path="/elsewhere",
                interface="org.example.X",
                member="Nothing",
                signature="h",
                body=[0],
                unix_fds=[mine],
            ),
            # A method that takes one, with the wrong arguments: nothing is served.
            Message(
                destination=served.server.unique_name,
                path=ROOT_PATH,
                interface=MANAGER,
                member=READ_FD.name,
                signature="h",
                body=[0],
                unix_fds=[mine, mine],
            ),
        ]
        for _ in range(25):
            for message in messages:
                message.serial = 0
                # Sent to both: the serving connection and a caller's.
                for bus in (served.server, served.caller):
                    message.destination = bus.unique_name
                    await stranger.send(message)
            # Paced by the bus's answers, as the bus holds only so many descriptors in flight.
            await bus_id(stranger)
        # A call answered after them all: everything before it was handled.
        assert await served.client.call(PLAIN, "after") == "after"
        os.close(mine)
        assert open_fds() - before == set()
    finally:
        stranger.disconnect()


async def test_a_call_that_takes_a_descriptor_keeps_it_until_its_handler_returns(
    served: Served, tmp_path: Path
) -> None:
    before = open_fds()
    mine = fd_of(tmp_path / "file")
    call = asyncio.create_task(served.client.call_with_fd(READ_FD, mine, "n"))
    await until(lambda: served.read, "the handler ran")
    assert served.read == [b"the file's bytes"]
    # The handler holds it still: the server's copy is open.
    assert len(open_fds() - before) == 2
    served.release.set()
    assert await call == "n"
    os.close(mine)
    await until(lambda: open_fds() - before == set(), "the server closed its copy")


async def test_a_handler_cancelled_closes_the_descriptor_it_was_given(
    served: Served, tmp_path: Path
) -> None:
    before = open_fds()
    mine = fd_of(tmp_path / "file")
    call = asyncio.create_task(served.client.call_with_fd(READ_FD, mine, "n"))
    await until(lambda: served.read, "the handler ran")
    os.close(mine)
    for task in asyncio.all_tasks():
        if "_serve" in repr(task.get_coro()):
            task.cancel()
    await until(lambda: open_fds() - before == set(), "the server closed it")
    call.cancel()


async def test_an_opened_descriptor_reaches_the_caller_and_the_server_closes_its_own(
    served: Served,
) -> None:
    before = open_fds()
    served.release.set()
    answer, fd = await served.client.call_for_fd(OPEN_FD, "n")
    assert answer == {"name": "n"}
    assert os.pread(fd, 100, 0) == b"the file's bytes"
    os.close(fd)
    await until(lambda: open_fds() - before == set(), "the server closed the one it opened")


async def test_a_caller_that_gave_up_closes_the_descriptor_that_comes_later(
    served: Served,
) -> None:
    before = open_fds()
    call = asyncio.create_task(served.client.call_for_fd(OPEN_FD, "n"))
    await asyncio.sleep(0.2)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    served.release.set()
    await until(lambda: served.opened, "the server opened it")
    # The reply comes, with its descriptor, to no one: closed on both sides.
    assert await served.client.call(PLAIN, "after") == "after"
    await until(lambda: open_fds() - before == set(), "every copy closed")


def test_a_method_that_passes_descriptors_is_declared_so() -> None:
    bound = Bound(MANAGER, READ_FD)
    assert bound.signature == "sh" and bound.names == ("name", "fd")
    assert READ_FD.params == ("name", "fd") and READ_FD.param_types == (str, int)
    assert OPEN_FD.reply_signature == "hs" and PLAIN.reply_signature == "s"


async def test_a_plain_call_answers_as_before(served: Served) -> None:
    assert await served.client.call(PLAIN, "x") == "x"
    reply = await served.caller.call(
        Message(
            destination=BUS_NAME,
            path=ROOT_PATH,
            interface=MANAGER,
            member=OPEN_FD.name,
            signature="s",
            body=["refuse"],
        )
    )
    assert reply is not None and reply.message_type == MessageType.ERROR
    assert reply.error_name == Problem.FORBIDDEN.dbus_name and reply.unix_fds == []
