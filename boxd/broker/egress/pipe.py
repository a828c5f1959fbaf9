"""Copying bytes both ways between a task's connection and the one the broker opened for it.

The bytes do not pass through Python: splice(2) moves them from one socket into a kernel pipe
and from the pipe into the other socket, driven by the event loop's readiness callbacks, with no
task, future or buffer per chunk.

Back-pressure: a direction reads only while its pipe is empty. A side that does not read holds
the other to one pipe's worth plus the kernel's socket buffers, so the broker's memory does not
grow however fast the other side sends.

Each direction ends on its own: an end of stream from one side is passed on as a half-close
(TCP FIN), so a client that sends its request and shuts its side still gets the whole answer.
An error on either side ends both.
"""

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import socket
from collections.abc import Callable

log = logging.getLogger(__name__)

# What one direction holds at most between reading and writing: its pipe's size. A pipe starts
# at the kernel's default (16 slots, 64 KiB of full pages) and grows to PIPE_BYTES after a read
# of GROW_AT or more, so only a bulk transfer takes the bigger one: pipes count against a
# per-user quota (/proc/sys/fs/pipe-user-pages-soft, 64 MiB by default, shared by every
# broker), past which the kernel makes new pipes tiny. GROW_AT is well below 64 KiB because a
# pipe counts slots, not bytes: from a network card each slot holds about one packet, so 16 of
# them can be full at some 23 KiB. 1 MiB is what an unprivileged process may ask for
# (/proc/sys/fs/pipe-max-size); a pipe that may not grow works as it is, more slowly.
PIPE_BYTES = 1024 * 1024
GROW_AT = 16 * 1024
# Grown pipes one broker holds at once, at most: 8 MiB, an eighth of that shared quota, so one
# task's bulk tunnels cannot spend it all and leave every other task's egress tiny pipes. Its
# other tunnels keep the default size, and work as fast as a 64 KiB pipe lets them.
MOST_GROWN = 8
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, which Python 3.11 does not name
_NONBLOCKING = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
# Reads in a row from one wake-up, at most, so one busy tunnel does not starve the others.
READS_PER_WAKE_UP = 8


class _Grown:
    """How many of this broker's pipes are grown now (one broker per process)."""

    count = 0


Ended = Callable[[OSError | None], None]


def tcp_socket(sock: socket.socket) -> socket.socket:
    """A socket ready for the pipe: non-blocking, and sending small writes at once (as asyncio's
    own transports do), so an interactive protocol through the tunnel is not held back."""
    sock.setblocking(False)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class FirstWords:
    """What the task is told before its tunnel's bytes (a proxy's 200, SOCKS5's success),
    sent the moment the target answers (boxd.broker.egress.connect); what the socket did not take at
    once stays in `unsent`, for the pipe to send first."""

    def __init__(self, sock: socket.socket, words: bytes) -> None:
        self.sock = sock
        self.unsent = words

    def send(self) -> None:
        if not self.unsent:
            return
        try:
            sent = self.sock.send(self.unsent)
        except OSError:
            # A full buffer, or a task that hung up: the pipe meets either again.
            return
        self.unsent = self.unsent[sent:]


class _Direction:
    """src -> dst through a pipe. `first` is sent before anything read from src (what the
    broker read past a request's head, or its own answer to the task)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        src: socket.socket,
        dst: socket.socket,
        first: bytes,
        ended: Ended,
    ) -> None:
        self.loop, self.src, self.dst, self.ended = loop, src, dst, ended
        self.first = memoryview(first)
        self.held = 0  # bytes in the pipe: read from src, not yet written to dst
        self.at_eof = False
        self.reading = False
        self.writing = False
        self.done = False
        self.pipe: tuple[int, int] | None = None
        self.may_grow = True
        self.grown = False

    def start(self) -> None:
        # The pipe is made when the first bytes arrive: the answer that opens a tunnel goes out
        # before it, and a connection that closes at once needs none.
        self._flush()

    def _make_pipe(self) -> tuple[int, int]:
        read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.pipe = (read_end, write_end)
        return self.pipe

    def _grow(self) -> None:
        """A big read: this is a bulk transfer, which moves faster through a bigger pipe. Asked
        once; not when the broker holds MOST_GROWN grown pipes already, and refused by the
        kernel when the user's pipe quota is spent: the pipe then stays as it is."""
        self.may_grow = False
        assert self.pipe is not None
        if _Grown.count >= MOST_GROWN:
            return
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.pipe[1], _F_SETPIPE_SZ, PIPE_BYTES)
            self.grown = True
            _Grown.count += 1

    def stop(self) -> None:
        self._stop_reading()
        self._stop_writing()
        if self.pipe is not None:
            for end in self.pipe:
                os.close(end)
            self.pipe = None
        if self.grown:
            self.grown = False
            _Grown.count -= 1

    def _readable(self) -> None:
        # While src has more and dst takes it all, read again at once: a bulk transfer then
        # costs one wake-up of the event loop per few pipes, not one per pipe.
        for _ in range(READS_PER_WAKE_UP):
            try:
                # A side that closes without sending anything (a client that only opened a
                # tunnel, an origin that hangs up unasked) needs no pipe: look before making one.
                if self.pipe is None and not self.src.recv(1, socket.MSG_PEEK):
                    count = 0
                else:
                    pipe = self.pipe or self._make_pipe()
                    count = os.splice(self.src.fileno(), pipe[1], PIPE_BYTES, flags=_NONBLOCKING)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                self._end(error)
                return
            if count == 0:
                self.at_eof = True
            elif count >= GROW_AT and self.may_grow:
                self._grow()
            self.held += count
            if not self._flush():
                return

    def _flush(self) -> bool:
        """Writes what is held; waits for dst when it is full, reads again when all is out.
        True when all is out and src may be read again."""
        try:
            while self.first:
                self.first = self.first[self.dst.send(self.first) :]
            while self.held:
                assert self.pipe is not None  # bytes are held in the pipe
                self.held -= os.splice(
                    self.pipe[0], self.dst.fileno(), self.held, flags=_NONBLOCKING
                )
        except (BlockingIOError, InterruptedError):
            # dst is full: stop reading src until dst takes what is held (back-pressure).
            self._stop_reading()
            self._start_writing()
            return False
        except OSError as error:
            self._end(error)
            return False
        self._stop_writing()
        if not self.at_eof:
            self._start_reading()
            return True
        self._stop_reading()
        try:
            self.dst.shutdown(socket.SHUT_WR)
        except OSError as error:
            self._end(error)
            return False
        self._end(None)
        return False

    def _end(self, error: OSError | None) -> None:
        if not self.done:
            self.done = True
            self.stop()
            self.ended(error)

    def _start_reading(self) -> None:
        if not self.reading:
            self.reading = True
            self.loop.add_reader(self.src.fileno(), self._readable)

    def _stop_reading(self) -> None:
        if self.reading:
            self.reading = False
            self.loop.remove_reader(self.src.fileno())

    def _start_writing(self) -> None:
        if not self.writing:
            self.writing = True
            self.loop.add_writer(self.dst.fileno(), self._flush)

    def _stop_writing(self) -> None:
        if self.writing:
            self.writing = False
            self.loop.remove_writer(self.dst.fileno())


# How connections end: the copy stops quietly. Any other error is a bug or a kernel without
# splice(2) for sockets, and is logged.
_ENDINGS = {
    errno.EPIPE,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ETIMEDOUT,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.ENOTCONN,
}


async def pipe(
    task: socket.socket, upstream: socket.socket, *, to_task: bytes = b"", to_upstream: bytes = b""
) -> None:
    """Copies until both directions ended, or one failed; the caller closes both sockets.
    `to_task` and `to_upstream` are sent first, ahead of what either side sends."""
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    left = 2

    def ended(error: OSError | None) -> None:
        nonlocal left
        left -= 1
        if error is not None and error.errno not in _ENDINGS:
            log.warning("egress tunnel failed: %s", error)
        # One direction failed: both end. Otherwise each waits for the other's end of stream.
        if not finished.done() and (error is not None or left == 0):
            finished.set_result(None)

    directions = [
        _Direction(loop, task, upstream, to_upstream, ended),
        _Direction(loop, upstream, task, to_task, ended),
    ]
    try:
        for direction in directions:
            direction.start()
        await finished
    finally:
        for direction in directions:
            direction.stop()
