"""`boxd broker <id>`: serves one task's broker socket, handed over by box-broker@<id>.socket,
and its egress proxies on the sockets box-egress-{http,socks}@<id>.socket bind in its namespace."""

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable

from boxd.broker.app import make_app
from boxd.broker.approvals import ApprovalWaiter
from boxd.broker.egress import Egress, task_hosts
from boxd.broker.manager_link import Manager, ManagerLink
from boxd.dbus.client import connect_system_bus
from boxd.errors import BoxError
from boxd.ids import check_task_id
from boxd.paths import box_home, task_dir
from boxd.socket_activation import passed_sockets, serve

# The FileDescriptorName of the task's proxy sockets (units/box-egress-*@.socket).
EGRESS_HTTP = "egress-http"
EGRESS_SOCKS = "egress-socks"
# How long an over-budget /call or an /ask waits for the owner before answering "pending".
DEFAULT_APPROVAL_WAIT_MS = 150_000

log = logging.getLogger(__name__)


def refusal_logger(manager: Manager) -> Callable[[str, str], Awaitable[None]]:
    async def on_refusal(target: str, reason: str) -> None:
        try:
            await manager.call("LogRefusal", json.dumps({"target": target, "reason": reason}))
        except BoxError as error:
            # The task is refused either way; only the log line is lost.
            log.warning("could not log the refusal of %s: %s", target, error.message)

    return on_refusal


async def run(task_id: str) -> None:
    check_task_id(task_id)
    bus = await connect_system_bus()
    manager = ManagerLink(bus, task_id)
    waiter = ApprovalWaiter(bus, task_id)
    await waiter.start()
    task = (await manager.call("GetTask"))["task"]
    home = box_home()
    wait_ms = float(os.environ.get("BOX_APPROVAL_WAIT_MS", DEFAULT_APPROVAL_WAIT_MS))
    app = make_app(manager, waiter, task, home, task_dir(home, task_id), wait_ms / 1000)
    passed = passed_sockets(f"box-broker@{task_id}.socket")
    egress = Egress(task_hosts(task), refusal_logger(manager))
    for sock in passed.pop(EGRESS_HTTP, []):
        await egress.serve_http(sock)
    for sock in passed.pop(EGRESS_SOCKS, []):
        await egress.serve_socks(sock)
    api = [sock for group in passed.values() for sock in group]
    try:
        await serve(app, f"box-broker@{task_id}.socket", api)
    finally:
        await egress.close()
        bus.disconnect()


def main(task_id: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(run(task_id))
