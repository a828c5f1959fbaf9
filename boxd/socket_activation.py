"""Serving an aiohttp app on the listening sockets systemd passed in, until stopped."""

import socket

from aiohttp import web
from systemd import daemon

from boxd.errors import Problem, die
from boxd.stopping import until_stopped


async def serve(app: web.Application, unit: str) -> None:
    fds = daemon.listen_fds()
    if not fds:
        die(Problem.FAILED, f"this service is started by {unit}, which passes its socket")
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    for fd in fds:
        await web.SockSite(runner, socket.socket(fileno=fd)).start()
    await until_stopped()
    await runner.cleanup()
