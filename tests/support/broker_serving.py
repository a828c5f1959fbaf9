"""A task's broker API (boxd/broker/app.py) served by its own server on a Unix socket, as the
broker's unit serves it, for the tests that talk to it."""

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from boxd.broker.app import Broker
from boxd.broker.http_server import HttpServer
from boxd.doors.connection_limits import BROKER_CONNECTIONS, Bounds


@asynccontextmanager
async def serving(
    broker: Broker, path: Path | str, bounds: Bounds | None = None
) -> AsyncIterator[HttpServer]:
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(path))
    listening.listen()
    server = HttpServer(broker.routes(), bounds or Bounds(BROKER_CONNECTIONS))
    await server.start([listening])
    try:
        yield server
    finally:
        await server.close()
        listening.close()
