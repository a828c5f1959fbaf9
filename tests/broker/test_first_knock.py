"""A spare's broker (boxd/broker/main.py), started before its task exists: it fetches its task
once a connection comes to one of its sockets, not before, and leaves that connection queued for
its server; a broker whose task exists fetches it at once; any other error stops it."""

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from boxd.broker.main import fetch_task
from boxd.dbus.interface import BROKER, Method, bound_on
from boxd.doors.socket_activation import Door
from boxd.errors import BoxError, Problem, die

TASK = {"id": "t000000001", "title": "x"}


class Manager:
    """The manager's GetTask: no task until `exists`, then the task."""

    def __init__(self, problem: Problem = Problem.NOT_FOUND) -> None:
        self.exists = False
        self.asked = 0
        self.problem = problem

    async def call(self, method: Method, *args: str) -> Any:
        member = bound_on(BROKER, method).name
        assert member == "GetTask"
        self.asked += 1
        if not self.exists:
            die(self.problem, f"no task {TASK['id']}")
        return {"task": TASK, "steps": []}


def _door(path: Path) -> Door:
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(path))
    listening.listen()
    listening.setblocking(False)
    return Door(listening.detach())


async def test_a_broker_whose_task_exists_fetches_it_at_once(tmp_path: Path) -> None:
    manager = Manager()
    manager.exists = True
    door = _door(tmp_path / "broker.sock")
    assert await fetch_task(manager, [door]) == TASK
    assert manager.asked == 1
    door.close()


async def test_a_spares_broker_waits_for_a_connection_and_leaves_it_queued(
    tmp_path: Path,
) -> None:
    manager = Manager()
    doors = [_door(tmp_path / "broker.sock"), _door(tmp_path / "model.sock")]
    fetching = asyncio.create_task(fetch_task(manager, doors))
    for _ in range(20):
        await asyncio.sleep(0)
    # No task yet, and nothing came: the broker asked once and waits, serving nothing.
    assert not fetching.done() and manager.asked == 1
    manager.exists = True
    for _ in range(20):
        await asyncio.sleep(0)
    assert not fetching.done(), "fetched before any connection came"
    worker = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    worker.connect(str(tmp_path / "model.sock"))
    assert await asyncio.wait_for(fetching, 5) == TASK
    assert manager.asked == 2
    # The connection is the server's to accept, still in the queue; no door is watched now.
    assert doors[1].queued() and doors[1].accepted == 0
    loop = asyncio.get_running_loop()
    for door in doors:
        assert not loop.remove_reader(door)
        door.close()
    worker.close()


async def test_a_connection_before_the_task_exists_stops_the_broker(tmp_path: Path) -> None:
    # Only root, or the spare's user, which runs nothing until a task takes it, can connect.
    manager = Manager()
    door = _door(tmp_path / "broker.sock")
    worker = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    worker.connect(str(tmp_path / "broker.sock"))
    with pytest.raises(BoxError) as raised:
        await asyncio.wait_for(fetch_task(manager, [door]), 5)
    assert raised.value.problem == Problem.NOT_FOUND
    door.close()
    worker.close()


async def test_any_other_error_stops_the_broker_at_once(tmp_path: Path) -> None:
    manager = Manager(Problem.FORBIDDEN)
    door = _door(tmp_path / "broker.sock")
    with pytest.raises(BoxError) as raised:
        await asyncio.wait_for(fetch_task(manager, [door]), 5)
    assert raised.value.problem == Problem.FORBIDDEN and manager.asked == 1
    door.close()


async def test_a_broker_with_no_task_and_no_socket_stops_rather_than_waits() -> None:
    manager = Manager()
    with pytest.raises(BoxError) as raised:
        await asyncio.wait_for(fetch_task(manager, []), 5)
    assert raised.value.problem == Problem.NOT_FOUND and manager.asked == 1
