"""The tunnel's copy (boxd.broker.egress.pipe) through a real Egress on 127.0.0.1: what a task sends
and gets arrives whole and in order, a side that does not read holds the other back instead of
making the broker buffer, and an error on one side ends both."""

import asyncio
import contextlib
import fcntl
import hashlib
import socket
import struct
from pathlib import Path

from boxd.broker.egress.pipe import MOST_GROWN, PIPE_BYTES, _Direction
from tests.support.egress_fixtures import egress, server

# A client's receive buffer, asked small so the broker's side fills soon.
SMALL_BUFFER = 64 * 1024
# How long the origin may make no progress before it is taken as held back for good.
STALLED_SECONDS = 2.0


def kernel_most(name: str) -> int:
    """The largest buffer the kernel lets a TCP socket grow to (tcp_rmem or tcp_wmem)."""
    return int(Path("/proc/sys/net/ipv4", name).read_text().split()[2])


async def tunnel(port: int, target: str, *, receive_buffer: int | None = None) -> socket.socket:
    """A blocking-free client socket through the proxy's CONNECT, past the 200."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b"\r\n\r\n"):
        answer += await loop.sock_recv(sock, 1)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    return sock


async def test_a_task_that_never_reads_a_fast_download_does_not_make_the_broker_buffer() -> None:
    # The attacker's test: an origin sends as fast as it can, the task reads nothing. What the
    # origin gets rid of can only sit in the kernel's socket buffers and the tunnel's pipe; a
    # copy without back-pressure would take it all into the broker's memory.
    bound = (
        kernel_most("tcp_wmem")  # the origin's send buffer
        + kernel_most("tcp_rmem")  # the broker's receive buffer, origin side
        + PIPE_BYTES
        + kernel_most("tcp_wmem")  # the broker's send buffer, task side
        + 2 * SMALL_BUFFER  # the task's receive buffer (the kernel doubles what is asked)
    )
    offered = 4 * bound
    sent = 0
    progress = asyncio.Event()
    block = bytes(1024 * 1024)

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        with contextlib.suppress(ConnectionError):
            while sent < offered:
                writer.write(block)
                await writer.drain()
                sent += len(block)
                progress.set()

    async with server(flood) as origin, egress(["example.com"]) as proxy:
        client = await tunnel(proxy.port, f"example.com:{origin}", receive_buffer=SMALL_BUFFER)
        try:
            # Until the origin is held back (no progress for a while) or got past the bound.
            while sent <= bound:
                progress.clear()
                try:
                    await asyncio.wait_for(progress.wait(), STALLED_SECONDS)
                except TimeoutError:
                    break
            assert sent <= bound, f"the broker took {sent} bytes the task never read"
            assert sent > 0
        finally:
            client.close()


async def test_a_slow_reader_gets_every_byte_in_order_both_ways() -> None:
    # A small receive buffer makes the broker's writes to the task fill up again and again, so
    # the copy waits and resumes many times; the digest says nothing was lost or reordered.
    size = 3 * PIPE_BYTES + 12345
    pattern = hashlib.sha256(b"boxd").digest() * (size // 32 + 1)
    payload = pattern[:size]

    async def origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upload = await reader.readexactly(size)
        writer.write(hashlib.sha256(upload).digest())
        writer.write(payload)
        await writer.drain()

    loop = asyncio.get_running_loop()
    async with server(origin) as port, egress(["example.com"]) as proxy:
        client = await tunnel(proxy.port, f"example.com:{port}", receive_buffer=SMALL_BUFFER)
        try:
            await loop.sock_sendall(client, payload)
            got = bytearray()
            while chunk := await loop.sock_recv(client, 4096):
                got += chunk
        finally:
            client.close()
    assert bytes(got[:32]) == hashlib.sha256(payload).digest()
    assert hashlib.sha256(got[32:]).digest() == hashlib.sha256(payload).digest()


async def test_a_reset_on_one_side_ends_the_other_and_the_connection_is_let_go() -> None:
    reset = asyncio.Event()

    async def resets(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(5)
        sock = writer.get_extra_info("socket")
        # SO_LINGER 0: close sends a reset, not an end of stream.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        reset.set()

    loop = asyncio.get_running_loop()
    async with server(resets) as port, egress(["example.com"]) as proxy:
        client = await tunnel(proxy.port, f"example.com:{port}")
        try:
            await loop.sock_sendall(client, b"hello")
            await reset.wait()
            # The task's side is closed too: it reads the end (or a reset), nothing else.
            try:
                rest = await asyncio.wait_for(loop.sock_recv(client, 100), 10)
            except ConnectionResetError:
                rest = b""
            assert rest == b""
        finally:
            client.close()
        # The broker closed the task's side after letting the connection go.
        assert proxy.egress.open_connections == 0


_F_GETPIPE_SZ = 1032


def test_one_broker_grows_at_most_most_grown_pipes_at_once() -> None:
    """The attacker's test: a task opening many bulk tunnels would take the pipe quota every
    broker shares (the boxd-broker user's), and leave other tasks' egress tiny pipes."""
    loop = asyncio.new_event_loop()
    pairs = [socket.socketpair() for _ in range(MOST_GROWN + 2)]
    directions = [_Direction(loop, a, b, b"", lambda error: None) for a, b in pairs]
    try:
        for direction in directions:
            direction._make_pipe()
            direction._grow()

        def size(direction: _Direction) -> int:
            assert direction.pipe is not None
            return fcntl.fcntl(direction.pipe[1], _F_GETPIPE_SZ)

        assert [size(d) for d in directions].count(PIPE_BYTES) == MOST_GROWN
        assert size(directions[-1]) < PIPE_BYTES
        # One grown pipe closed gives its place to the next bulk transfer.
        directions[0].stop()
        later = _Direction(loop, *pairs[0], b"", lambda error: None)
        later._make_pipe()
        later._grow()
        assert size(later) == PIPE_BYTES
        directions[0] = later
    finally:
        for direction in directions:
            direction.stop()
        for a, b in pairs:
            a.close()
            b.close()
        loop.close()
