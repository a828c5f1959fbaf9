"""`boxd web`: serves the HTTP API on the socket boxd-web.socket passes in."""

import asyncio
import logging

from boxd.doors.connection_guard import serve
from boxd.doors.connection_limits import GATEWAY_CONNECTIONS
from boxd.web.app import make_app


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(make_app(), "boxd-web.socket", GATEWAY_CONNECTIONS))
