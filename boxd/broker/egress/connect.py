"""Connecting a non-blocking socket from the event loop, with what follows the connection done
in the readiness callback that sees it made.

asyncio's sock_connect sets a future there, and the coroutine waiting on it wakes a turn of the
loop later. A proxy's answer to the task (the 200 of a CONNECT, SOCKS5's success) is what the
task waits for before it sends anything, so it goes out from the callback itself, a turn of
the loop sooner (docs/performance.md, "Egress").
"""

import asyncio
import errno
import os
import socket
from collections.abc import Callable

_NOT_YET = (errno.EINPROGRESS, errno.EALREADY, errno.EINTR)


async def connect(
    sock: socket.socket, address: tuple[str, int], on_open: Callable[[], None] | None = None
) -> None:
    """Connects the non-blocking `sock`, as the event loop's sock_connect does, and runs
    `on_open` as soon as the connection is made: from the readiness callback itself, a turn of
    the loop before the waiting coroutine wakes."""
    try:
        sock.connect(address)
    except (BlockingIOError, InterruptedError):
        pass
    else:
        if on_open is not None:
            on_open()
        return
    loop = asyncio.get_running_loop()
    made: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def ready() -> None:
        if made.done():
            return
        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code in _NOT_YET:
            return
        loop.remove_writer(fd)
        if code != 0:
            made.set_exception(OSError(code, os.strerror(code)))
            return
        try:
            if on_open is not None:
                on_open()
        except Exception as error:
            made.set_exception(error)
            return
        made.set_result(None)

    loop.add_writer(fd, ready)
    try:
        await made
    finally:
        loop.remove_writer(fd)
