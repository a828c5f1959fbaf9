"""`boxd broker <id>`: serves one task's broker socket, handed over by box-broker@<id>.socket."""

import asyncio
import logging

from boxd.broker.app import make_app
from boxd.broker.manager_link import ManagerLink
from boxd.dbus.client import connect_system_bus
from boxd.ids import check_task_id
from boxd.paths import box_home, task_dir
from boxd.socket_activation import serve


async def run(task_id: str) -> None:
    check_task_id(task_id)
    bus = await connect_system_bus()
    app = make_app(ManagerLink(bus, task_id), task_dir(box_home(), task_id))
    try:
        await serve(app, f"box-broker@{task_id}.socket")
    finally:
        bus.disconnect()


def main(task_id: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(run(task_id))
