"""Waiting for systemd's SIGTERM (or Ctrl-C) inside the event loop."""

import asyncio
import signal


async def until_stopped() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    await stop.wait()
