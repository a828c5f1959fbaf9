"""The apps' runners (boxd/apps/runner.py, app_server.py) serving their sockets in a test's
directory, as box-app@.socket and box-app@.service serve them, and a broker's link to them: a
broker's tools in these tests run the way they do in a box, over the wire."""

import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from boxd.apps import echo, mail, wallet
from boxd.apps.app_server import AppServer
from boxd.apps.runner import Runner
from boxd.broker.app_link import Apps
from boxd.sdk import App
from boxd.wire.app_runner import socket_path

SHIPPED = {app.name: app for app in (echo.app, mail.app, wallet.app)}


def sockets(directory: Path) -> Path:
    return directory / "app-sockets"


@asynccontextmanager
async def runners(
    directory: Path,
    apps: Mapping[str, App] = SHIPPED,
    secrets: Mapping[str, str] | None = None,
) -> AsyncIterator[Apps]:
    """Each app's runner on `<directory>/app-sockets/<app>.sock`, its state in
    `<directory>/apps/<app>`, handed those of `secrets` that its tools declare."""
    held = dict(secrets or {})
    sockets(directory).mkdir(exist_ok=True)
    served: list[tuple[AppServer, socket.socket]] = []
    for name, app in apps.items():
        state = directory / "apps" / name
        state.mkdir(parents=True, exist_ok=True)
        runner = Runner(
            name,
            app,
            "",
            state,
            lambda wanted: {secret: held[secret] for secret in wanted if secret in held},
        )
        listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listening.bind(str(socket_path(sockets(directory), name)))
        listening.listen()
        server = AppServer(runner.answer, None)
        await server.start([listening])
        served.append((server, listening))
    link = Apps(sockets(directory))
    try:
        yield link
    finally:
        await link.close()
        for server, listening in served:
            await server.stop(0)
            listening.close()
