"""`boxd broker <id>`: serves one task's broker socket, handed over by box-broker@<id>.socket,
its egress proxies on the sockets box-egress-{http,socks}@<id>.socket bind in its namespace, and
its model gateway on the socket box-model@<id>.socket binds there.

It exits 0 once idle for BOX_BROKER_IDLE_MS (boxd/broker/idle.py), and its sockets start it
again on the next connection. A spare's broker (boxd/manager/spares.py) is started before its
task exists: it imports and joins the bus ahead, then waits, serving nothing and never idle, for
the first connection to any of its sockets, which only its task's worker can make, and fetches
its task then. Start-up is on the path of that connection, so only what the
broker API needs is imported up front: the egress proxies and the model gateway (aiohttp's
client side, the proxies' parsers) are imported, in a thread, when their first connection
comes, which many tasks never make.
"""

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from boxd.broker.app import make_broker
from boxd.broker.app_link import Apps
from boxd.broker.approvals import ApprovalWaiter
from boxd.broker.egress.refusal_log import RefusalLog
from boxd.broker.http_server import HttpServer
from boxd.broker.idle import IdleWatch, idle_seconds
from boxd.broker.manager_link import Manager, ManagerLink, Waiter
from boxd.dbus import interface as api
from boxd.dbus.client import connect_system_bus
from boxd.doors.connection_limits import BROKER_CONNECTIONS, Bounds
from boxd.doors.socket_activation import Door, passed_sockets
from boxd.doors.stopping import until_stopped
from boxd.errors import BoxError, Problem
from boxd.wire.ids import check_task_id

if TYPE_CHECKING:
    from boxd.broker.egress.proxies import Egress
    from boxd.broker.model.gateway import ModelGateway

log = logging.getLogger(__name__)

# The FileDescriptorName of the task's proxy sockets (units/box-egress-*@.socket).
EGRESS_HTTP = "egress-http"
EGRESS_SOCKS = "egress-socks"
# The FileDescriptorName of the task's model gateway socket (units/box-model@.socket).
MODEL_GATEWAY = "model-gateway"
# How long an over-budget /call or an /ask waits for the owner before answering "pending".
DEFAULT_APPROVAL_WAIT_MS = 150_000


def _egress_kind() -> "type[Egress]":
    from boxd.broker.egress.proxies import Egress

    return Egress


def _gateway_kind() -> "type[ModelGateway]":
    from boxd.broker.model.gateway import ModelGateway

    return ModelGateway


class LateDoors:
    """The egress proxies and the model gateway, imported and made on their first connection.
    Until then their sockets are watched, not served: the connection waits in the socket's
    queue and is accepted once its server is up."""

    def __init__(
        self,
        task: dict[str, Any],
        manager: Manager,
        waiter: Waiter,
        wait_seconds: float,
        reserved: Callable[[], dict[str, float]],
        refusals: RefusalLog,
    ) -> None:
        self._task = task
        self._manager = manager
        self._waiter = waiter
        self._wait_seconds = wait_seconds
        self._reserved = reserved
        self._refusals = refusals
        self.egress: Egress | None = None
        self.gateway: ModelGateway | None = None
        # Set with the error when a server could not be made: the broker fails (and systemd
        # starts it again), as it did when it made them all at start-up.
        self.failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._starting: set[asyncio.Task[None]] = set()

    def watch(self, door: Door, serve: Callable[[Door], Coroutine[Any, Any, None]]) -> None:
        loop = asyncio.get_running_loop()

        def arrived() -> None:
            loop.remove_reader(door)
            job = loop.create_task(serve(door))
            self._starting.add(job)
            job.add_done_callback(self._started)

        loop.add_reader(door, arrived)

    def _started(self, job: "asyncio.Task[None]") -> None:
        self._starting.discard(job)
        if job.cancelled() or self.failed.done():
            return
        error = job.exception()
        if error is not None:
            self.failed.set_exception(error)

    async def _egress(self) -> "Egress":
        kind = await asyncio.to_thread(_egress_kind)
        if self.egress is None:
            from boxd.broker.egress.proxies import task_hosts

            self.egress = kind(task_hosts(self._task), self._refusals)
        return self.egress

    async def serve_http(self, door: Door) -> None:
        await (await self._egress()).serve_http(door)

    async def serve_socks(self, door: Door) -> None:
        await (await self._egress()).serve_socks(door)

    async def serve_gateway(self, door: Door) -> None:
        kind = await asyncio.to_thread(_gateway_kind)
        if self.gateway is None:
            self.gateway = kind(
                self._manager, self._waiter, self._task, self._wait_seconds, self._reserved
            )
        await self.gateway.serve(door)

    def resting(self) -> set[int]:
        return self.gateway.resting() if self.gateway is not None else set()

    def busy(self) -> bool:
        return bool(self._starting) or (self.gateway is not None and self.gateway.busy())

    async def close(self) -> None:
        for job in self._starting:
            job.cancel()
        await asyncio.gather(*self._starting, return_exceptions=True)
        if self.gateway is not None:
            await self.gateway.close()
        if self.egress is not None:
            await self.egress.close()


async def _until_first(*waits: Awaitable[None]) -> None:
    """Returns when the first of `waits` does (raising what it raised), cancelling the rest."""
    jobs = [asyncio.ensure_future(wait) for wait in waits]
    try:
        done, _ = await asyncio.wait(jobs, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for job in jobs:
            job.cancel()
    for job in done:
        job.result()


async def _first_knock(doors: list[Door]) -> None:
    """Returns once a connection waits on any of the doors, leaving it in the queue."""
    loop = asyncio.get_running_loop()
    knocked: asyncio.Future[None] = loop.create_future()

    def knock() -> None:
        if not knocked.done():
            knocked.set_result(None)

    for door in doors:
        loop.add_reader(door, knock)
    try:
        await knocked
    finally:
        for door in doors:
            loop.remove_reader(door)


async def fetch_task(manager: Manager, doors: list[Door]) -> dict[str, Any]:
    """The broker's task. A spare's has none yet: it is fetched once the first connection comes,
    which only the task's worker can make (each socket is its user's alone, or in its network
    namespace); the manager gives a broker no task but its own unit's id's."""
    try:
        task: dict[str, Any] = (await manager.call(api.BROKER_GET_TASK, ""))["task"]
        return task
    except BoxError as error:
        # With no socket, nothing would ever knock.
        if error.problem != Problem.NOT_FOUND or not doors:
            raise
    await _first_knock(doors)
    task = (await manager.call(api.BROKER_GET_TASK, ""))["task"]
    return task


async def run(task_id: str) -> None:
    check_task_id(task_id)
    idle = idle_seconds()
    bus = await connect_system_bus()
    manager = ManagerLink(bus, task_id)
    waiter = ApprovalWaiter(manager)
    passed = passed_sockets(f"box-broker@{task_id}.socket")
    doors = [door for group in passed.values() for door in group]
    task = await fetch_task(manager, doors)
    wait_ms = float(os.environ.get("BOX_APPROVAL_WAIT_MS", DEFAULT_APPROVAL_WAIT_MS))
    broker = make_broker(manager, waiter, task, Apps(), wait_ms / 1000)
    refusals = RefusalLog(manager)
    late = LateDoors(task, manager, waiter, wait_ms / 1000, broker.calls.reserved, refusals)
    for door in passed.pop(EGRESS_HTTP, []):
        late.watch(door, late.serve_http)
    for door in passed.pop(EGRESS_SOCKS, []):
        late.watch(door, late.serve_socks)
    for door in passed.pop(MODEL_GATEWAY, []):
        late.watch(door, late.serve_gateway)
    server = HttpServer(broker.routes(), Bounds(BROKER_CONNECTIONS))
    try:
        await server.start([door for group in passed.values() for door in group])
        waits: list[Awaitable[None]] = [until_stopped(), late.failed]
        if idle is not None:
            watch = IdleWatch(
                idle,
                doors,
                resting=lambda: server.resting() | late.resting(),
                busy=[broker.calls.busy, late.busy],
            )
            waits.append(_idle_exit(watch, task_id))
        await _until_first(*waits)
    finally:
        await server.close()
        await late.close()
        await broker.apps.close()
        await refusals.close()
        bus.disconnect()


async def _idle_exit(watch: IdleWatch, task_id: str) -> None:
    await watch.wait()
    log.info(
        "nothing in hand for %g s: the broker of task %s exits; its sockets start it again "
        "on the next connection",
        watch.seconds,
        task_id,
    )


def main(task_id: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(run(task_id))
