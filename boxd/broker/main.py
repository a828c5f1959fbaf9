"""`boxd broker <id>`: serves one task's broker socket, handed over by box-broker@<id>.socket,
its egress proxies on the sockets box-egress-{http,socks}@<id>.socket bind in its namespace, and
its model gateway on the socket box-model@<id>.socket binds there."""

import asyncio
import logging
import os

from boxd.broker.app import CALLS, make_app
from boxd.broker.approvals import ApprovalWaiter
from boxd.broker.egress import Egress, task_hosts
from boxd.broker.manager_link import ManagerLink
from boxd.broker.model_gateway import ModelGateway
from boxd.broker.refusal_log import RefusalLog
from boxd.connection_limits import BROKER_CONNECTIONS
from boxd.dbus.client import connect_system_bus
from boxd.ids import check_task_id
from boxd.paths import box_home, task_dir
from boxd.socket_activation import passed_sockets, serve

# The FileDescriptorName of the task's proxy sockets (units/box-egress-*@.socket).
EGRESS_HTTP = "egress-http"
EGRESS_SOCKS = "egress-socks"
# The FileDescriptorName of the task's model gateway socket (units/box-model@.socket).
MODEL_GATEWAY = "model-gateway"
# How long an over-budget /call or an /ask waits for the owner before answering "pending".
DEFAULT_APPROVAL_WAIT_MS = 150_000


async def run(task_id: str) -> None:
    check_task_id(task_id)
    bus = await connect_system_bus()
    manager = ManagerLink(bus, task_id)
    waiter = ApprovalWaiter(bus, task_id)
    await waiter.start()
    task = (await manager.call("GetTask", ""))["task"]
    home = box_home()
    wait_ms = float(os.environ.get("BOX_APPROVAL_WAIT_MS", DEFAULT_APPROVAL_WAIT_MS))
    app = make_app(manager, waiter, task, home, task_dir(home, task_id), wait_ms / 1000)
    passed = passed_sockets(f"box-broker@{task_id}.socket")
    refusals = RefusalLog(manager)
    egress = Egress(task_hosts(task), refusals)
    for sock in passed.pop(EGRESS_HTTP, []):
        await egress.serve_http(sock)
    for sock in passed.pop(EGRESS_SOCKS, []):
        await egress.serve_socks(sock)
    gateway = ModelGateway(manager, waiter, task, wait_ms / 1000, app[CALLS].reserved)
    for sock in passed.pop(MODEL_GATEWAY, []):
        await gateway.serve(sock)
    api = [sock for group in passed.values() for sock in group]
    try:
        await serve(app, f"box-broker@{task_id}.socket", BROKER_CONNECTIONS, api)
    finally:
        await gateway.close()
        await egress.close()
        await refusals.close()
        bus.disconnect()


def main(task_id: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(run(task_id))
