"""A broker exits once idle (boxd/broker/idle.py): what counts as in hand, and that nothing that
comes as it exits is lost. Real listening sockets, served as the broker serves them; the idle
time is shortened to a fraction of a second.

The attacker's tests come first: a task poking its broker keeps it up rather than making it
exit and start over and over, and a connection that comes just as it exits is answered by the
next broker on the same socket, as systemd hands it over."""

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from boxd.broker.app import Broker
from boxd.broker.calls import Calls
from boxd.broker.egress.refusal_log import RefusalLog
from boxd.broker.http_request import Request
from boxd.broker.http_server import Answer, HttpServer, Routes, json_answer
from boxd.broker.idle import IDLE_VARIABLE, IdleWatch, idle_seconds
from boxd.broker.main import LateDoors
from boxd.dbus.interface import BROKER, Method, bound_on
from boxd.doors.connection_limits import Bounds
from boxd.doors.idle_time import DEFAULT_IDLE_MS, SHORTEST_IDLE_MS
from boxd.doors.socket_activation import Door
from tests.support.gated_broker import Gate, broker, post
from tests.support.memory_log import MemoryLog, MemoryWaiter, until

__all__ = ["broker"]  # the fixture (tests/support/gated_broker.py)

IDLE = 0.3
# Well past the idle time: what keeps a broker up must keep it up this long.
LONG = 4 * IDLE


class Listening:
    """A listening socket held as systemd holds a socket unit's: each broker it starts gets a
    Door on it (a descriptor of its own), and the socket stays between brokers."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._held.bind(self.path)
        self._held.listen(64)

    def __call__(self) -> Door:
        return Door(os.dup(self._held.fileno()))

    def close(self) -> None:
        self._held.close()


@pytest.fixture
def listening(tmp_path: Path) -> Iterator[Listening]:
    held = Listening(tmp_path / "broker.sock")
    yield held
    held.close()


def path_of(listening: Listening) -> str:
    return listening.path


def hello_app(hold: asyncio.Event | None = None) -> Routes:
    async def hello(request: Request) -> Answer:
        if hold is not None:
            await hold.wait()
        return json_answer({"pid": os.getpid()})

    return Routes({"/hello": {"GET": hello}}, lambda failure: 400, "GET /hello")


@asynccontextmanager
async def guarded(door: Door, routes: Routes) -> AsyncIterator[HttpServer]:
    """Served as the broker serves its socket."""
    server = HttpServer(routes, Bounds(16))
    await server.start([door])
    try:
        yield server
    finally:
        await server.close()


def watch(door: Door, guard: HttpServer | None = None, **more: Any) -> IdleWatch:
    resting = guard.resting if guard is not None else set
    return IdleWatch(IDLE, [door], resting=resting, **more)


async def stays_up(waiting: Awaitable[None], seconds: float = LONG) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(waiting, seconds)


async def spin(turns: int = 20) -> None:
    """Lets the event loop go round: a socket still watched would be accepted by then."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def get(path: str, session: aiohttp.ClientSession | None = None) -> Any:
    if session is None:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path)) as own:
            return await get(path, own)
    async with session.get("http://box/hello") as response:
        return await response.json()


# --- the attacker's tests -----------------------------------------------------------------------


async def test_a_task_poking_its_broker_keeps_it_up_then_it_exits_once(
    listening: Listening,
) -> None:
    door = listening()
    async with guarded(door, hello_app()) as guard:
        idle = asyncio.create_task(watch(door, guard).wait())
        # A connection opened and closed at once, over and over: never an exit meanwhile.
        for _ in range(int(LONG / (IDLE / 3))):
            _, writer = await asyncio.open_unix_connection(path_of(listening))
            writer.close()
            await writer.wait_closed()
            await asyncio.sleep(IDLE / 3)
            assert not idle.done()
        await asyncio.wait_for(idle, IDLE * 3)
        assert door.accepted >= LONG / (IDLE / 3)


async def test_a_request_that_comes_as_the_broker_exits_is_answered_by_the_next(
    listening: Listening,
) -> None:
    first = listening()
    async with guarded(first, hello_app()):
        await watch(first).wait()
        # Exactly as it exits: after its last look, before it has closed anything.
        request = asyncio.create_task(get(path_of(listening)))
        await spin()
        assert first.accepted == 0 and first.queued()
        assert not request.done()
    # The first broker is gone; systemd starts the next on the same socket.
    second = listening()
    async with guarded(second, hello_app()):
        assert await asyncio.wait_for(request, 5) == {"pid": os.getpid()}
        assert second.accepted == 1


async def test_every_request_of_a_worker_pausing_about_the_idle_time_is_answered(
    listening: Listening,
) -> None:
    """Brokers that exit and come back under a worker asking every so often, some asks right
    at an exit: each is answered, by whichever broker holds the socket."""
    answered = 0
    brokers = 0

    async def brokers_in_turn() -> None:
        nonlocal brokers
        while True:
            door = listening()
            brokers += 1
            async with guarded(door, hello_app()) as guard:
                await watch(door, guard).wait()

    serving = asyncio.create_task(brokers_in_turn())
    try:
        for pause in (IDLE * 0.5, IDLE * 1.1, IDLE * 1.25, IDLE * 1.4, IDLE * 0.9, IDLE * 1.6):
            assert await asyncio.wait_for(get(path_of(listening)), 5) == {"pid": os.getpid()}
            answered += 1
            await asyncio.sleep(pause)
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    assert answered == 6
    assert brokers > 1


# --- what counts as in hand ---------------------------------------------------------------------


async def test_nothing_in_hand_exits_after_the_idle_time_and_stops_accepting(
    listening: Listening,
) -> None:
    door = listening()
    made = 0

    def factory() -> asyncio.Protocol:
        nonlocal made
        made += 1
        return asyncio.Protocol()

    server = await asyncio.get_running_loop().create_server(factory, sock=door)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await asyncio.wait_for(watch(door).wait(), IDLE * 5)
    assert loop.time() - began >= IDLE
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path_of(listening))
    await spin()
    assert made == 0 and door.accepted == 0 and door.queued()
    server.close()
    client.close()


async def test_a_request_in_hand_keeps_it_up(listening: Listening) -> None:
    """An /ask waiting for the owner, a model reply streaming: a request not yet answered."""
    door = listening()
    hold = asyncio.Event()
    async with guarded(door, hello_app(hold)) as guard:
        idle = asyncio.create_task(watch(door, guard).wait())
        asking = asyncio.create_task(get(path_of(listening)))
        await stays_up(asyncio.shield(idle))
        hold.set()
        await asking
        await asyncio.wait_for(idle, IDLE * 5)


async def test_a_connection_that_sent_nothing_yet_keeps_it_up(
    listening: Listening,
) -> None:
    door = listening()
    async with guarded(door, hello_app()) as guard:
        _, writer = await asyncio.open_unix_connection(path_of(listening))
        await stays_up(watch(door, guard).wait())
        writer.close()


async def test_a_tunnel_keeps_it_up_however_quiet(listening: Listening) -> None:
    """A door served by something other than an HTTP server (the egress proxies): every open
    connection counts, from its accept."""
    door = listening()

    async def tunnel(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Holds the writer: from Python 3.12 on, a StreamWriter collected closes its connection.
        await reader.read()
        writer.close()

    server = await asyncio.start_server(tunnel, sock=door)
    _, writer = await asyncio.open_unix_connection(path_of(listening))
    await stays_up(watch(door).wait())
    writer.close()
    server.close()


async def test_a_connection_waiting_to_be_accepted_keeps_it_up(
    listening: Listening,
) -> None:
    """A door whose server is not made yet (the model gateway until its first connection)."""
    door = listening()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path_of(listening))
    assert door.queued()
    await stays_up(watch(door).wait())
    client.close()


async def test_what_the_broker_does_by_itself_keeps_it_up(listening: Listening) -> None:
    door = listening()
    busy = True
    idle = asyncio.create_task(watch(door, busy=[lambda: busy]).wait())
    await stays_up(asyncio.shield(idle))
    busy = False
    await asyncio.wait_for(idle, IDLE * 5)


async def test_a_keep_alive_connection_at_rest_does_not_keep_it_up(
    listening: Listening,
) -> None:
    door = listening()
    async with (
        guarded(door, hello_app()) as guard,
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path_of(listening))) as session,
    ):
        await get(path_of(listening), session)
        assert len(door.open_connections()) == 1
        assert guard.resting() == door.open_connections()
        await asyncio.wait_for(watch(door, guard).wait(), IDLE * 5)
    # Closed as the broker goes; the worker's next request opens another connection.
    assert door.open_connections() == set()


def blocking_get(client: socket.socket) -> bytes:
    client.sendall(b"GET /hello HTTP/1.1\r\nHost: box\r\n\r\n")
    return client.recv(65536)


@asynccontextmanager
async def resting_client(
    listening: Listening,
) -> AsyncIterator[tuple[Door, HttpServer, socket.socket]]:
    """A served door and a client's keep-alive connection at rest on it, its request answered."""
    door = listening()
    async with guarded(door, hello_app()) as server:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path_of(listening))
            await asyncio.to_thread(blocking_get, client)
            await until(lambda: server.resting() == door.open_connections() != set())
            yield door, server, client


async def test_a_request_sent_on_a_resting_connection_not_yet_read_keeps_it_up(
    listening: Listening,
) -> None:
    """The kernel holds the worker's next request; the broker has not read it yet: it is in
    hand, not a connection at rest to close under it."""
    async with resting_client(listening) as (door, server, client):
        watching = watch(door, server)
        assert not watching.in_hand()
        # Sent, and no turn of the loop since: only the kernel has it.
        client.sendall(b"GET /hello HTTP/1.1\r\nHost: box\r\n\r\n")
        assert watching.in_hand()
        assert json.loads((await asyncio.to_thread(client.recv, 65536)).split(b"\r\n\r\n")[1])


async def test_a_request_sent_after_the_last_look_is_refused_at_once_not_lost(
    listening: Listening,
) -> None:
    """The broker decided to go: a connection at rest is shut for reading in that same step, so
    a request sent on it after fails there and then, and the worker asks the next broker."""
    async with resting_client(listening) as (door, server, client):
        await asyncio.wait_for(watch(door, server).wait(), IDLE * 5)
        with pytest.raises(BrokenPipeError):
            client.sendall(b"GET /hello HTTP/1.1\r\nHost: box\r\n\r\n")


async def test_a_call_whose_caller_hung_up_keeps_it_busy(
    broker: tuple[str, Any, Gate, Broker],
) -> None:
    path, log, gate, served = broker
    calls: Calls = served.calls
    assert not calls.busy()
    caller = asyncio.create_task(post(path, "k1"))
    await until(lambda: gate.entered == ["k1"])
    caller.cancel()
    await asyncio.gather(caller, return_exceptions=True)
    assert calls.busy()
    gate.open.set()
    await until(lambda: not calls.busy())
    assert [r["key"] for r in log.results] == ["k1"]


# --- the setting --------------------------------------------------------------------------------


def test_the_idle_time_setting() -> None:
    assert idle_seconds({}) == DEFAULT_IDLE_MS / 1000
    assert idle_seconds({IDLE_VARIABLE: "2500"}) == 2.5
    assert idle_seconds({IDLE_VARIABLE: "0"}) is None
    with pytest.raises(ValueError, match=f"^{IDLE_VARIABLE} must be a whole number"):
        idle_seconds({IDLE_VARIABLE: "1.5"})
    with pytest.raises(ValueError, match=f"at least {SHORTEST_IDLE_MS} ms, not 100"):
        idle_seconds({IDLE_VARIABLE: "100"})


# --- the doors made on their first connection ---------------------------------------------------


class Refusals:
    """The manager's side of LogRefusal, in memory."""

    def __init__(self) -> None:
        self.logged: list[dict[str, Any]] = []

    async def call(self, method: Method, *args: str) -> Any:
        member = bound_on(BROKER, method).name
        assert member == "LogRefusal"
        self.logged.append(json.loads(args[0]))
        return {}


async def test_the_first_connection_to_a_late_door_is_answered_by_the_server_it_starts(
    tmp_path: Path,
) -> None:
    """The egress proxy and the model gateway are made when their first connection comes: that
    connection waits in the socket's queue meanwhile, and is answered, not dropped."""
    manager = Refusals()
    log = MemoryLog("")
    refusals = RefusalLog(manager)
    late = LateDoors(log.task, manager, MemoryWaiter(log), 1.0, dict, refusals)
    proxy = Listening(tmp_path / "proxy.sock")
    gateway = Listening(tmp_path / "model.sock")
    late.watch(proxy(), late.serve_http)
    late.watch(gateway(), late.serve_gateway)
    await spin()
    assert late.egress is None and late.gateway is None
    reader, writer = await asyncio.open_unix_connection(proxy.path)
    writer.write(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 10)
    assert answer.startswith(b"HTTP/1.1 403"), answer[:200]
    assert late.egress is not None and late.gateway is None
    async with (
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=gateway.path)) as session,
        session.post("http://box/v1/messages", json={"messages": []}) as response,
    ):
        said = await response.json()
    assert response.status == 400
    assert said["error"]["message"].startswith(f"task {log.task['id']} names no model")
    await late.close()
    await refusals.close()
    assert [entry["target"] for entry in manager.logged] == ["example.com:443"]
    assert not late.failed.done()
