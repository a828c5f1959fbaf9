"""The SOCKS5 proxy a task's BOX_SOCKS_PROXY points at (RFC 1928): no authentication, CONNECT
only, to targets the task's hosts allow.

SOCKS replies carry a code, not words, so a refusal's reason reaches the task's log through
on_refusal; the task itself reads 0x02, "connection not allowed by ruleset".
"""

import asyncio
import contextlib
import errno
import ipaddress
import logging
import socket
import struct

from boxd.broker.egress.dial import Dialer, Refusal, Refused, Unreachable
from boxd.broker.egress.pipe import FirstWords, pipe
from boxd.broker.egress.socket_reader import SocketReader
from boxd.doors.connection_limits import HEAD_SECONDS
from boxd.doors.paced_log import PacedLog
from boxd.net.egress_target import MAX_NAME, Target, make_target

log = logging.getLogger(__name__)

VERSION = 5
NO_AUTH = 0x00
NO_ACCEPTABLE_METHOD = 0xFF
CONNECT, BIND, UDP_ASSOCIATE = 0x01, 0x02, 0x03
IPV4, DOMAIN, IPV6 = 0x01, 0x03, 0x04

SUCCEEDED = 0x00
GENERAL_FAILURE = 0x01
NOT_ALLOWED = 0x02
NETWORK_UNREACHABLE = 0x03
HOST_UNREACHABLE = 0x04
CONNECTION_REFUSED = 0x05
COMMAND_NOT_SUPPORTED = 0x07
ADDRESS_TYPE_NOT_SUPPORTED = 0x08


_COMMANDS = {BIND: "BIND", UDP_ASSOCIATE: "UDP ASSOCIATE"}
_UNREACHABLE_CODES = {
    errno.ECONNREFUSED: CONNECTION_REFUSED,
    errno.ENETUNREACH: NETWORK_UNREACHABLE,
    errno.EHOSTUNREACH: HOST_UNREACHABLE,
    errno.ETIMEDOUT: HOST_UNREACHABLE,
}


class _Unsupported(Exception):
    """The request cannot be read as SOCKS5; `code` is the reply, or None for no reply."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


def reply(code: int) -> bytes:
    """A reply whose bound address is always 0.0.0.0:0: the address the broker connected from
    is one of the box's own, which tasks have no business learning; clients of CONNECT do not
    use it."""
    return bytes([VERSION, code, 0, IPV4, 0, 0, 0, 0, 0, 0])


async def _greet(reader: SocketReader) -> None:
    version, count = await reader.readexactly(2)
    if version != VERSION:
        raise _Unsupported(f"the client speaks SOCKS version {version}, not 5", None)
    methods = await reader.readexactly(count)
    if NO_AUTH not in methods:
        await _send(reader.sock, bytes([VERSION, NO_ACCEPTABLE_METHOD]))
        raise _Unsupported("the client offered no method without authentication", None)
    await _send(reader.sock, bytes([VERSION, NO_AUTH]))


async def _request(reader: SocketReader) -> tuple[int, Target]:
    version, command, _, kind = await reader.readexactly(4)
    if version != VERSION:
        raise _Unsupported(f"the request is SOCKS version {version}, not 5", GENERAL_FAILURE)
    if kind == IPV4:
        host = str(ipaddress.IPv4Address(await reader.readexactly(4)))
    elif kind == IPV6:
        host = str(ipaddress.IPv6Address(await reader.readexactly(16)))
    elif kind == DOMAIN:
        (length,) = await reader.readexactly(1)
        host = (await reader.readexactly(length)).decode("utf-8", "replace")[:MAX_NAME]
    else:
        raise _Unsupported(f"address type {kind} is not SOCKS5's", ADDRESS_TYPE_NOT_SUPPORTED)
    (port,) = struct.unpack("!H", await reader.readexactly(2))
    return command, make_target(host, port)


async def _send(sock: socket.socket, data: bytes) -> None:
    """A reply of a few bytes: the socket's buffer takes it at once, unless the task stopped
    reading with its buffer full, and then it gets HEAD_SECONDS."""
    async with asyncio.timeout(HEAD_SECONDS):
        await asyncio.get_running_loop().sock_sendall(sock, data)


class Socks5Proxy:
    def __init__(self, dialer: Dialer, on_refusal: Refusal) -> None:
        self.dialer = dialer
        self.on_refusal = on_refusal
        # A task at its cap that keeps connecting would log a line per connection.
        self._closed_log = PacedLog(log)

    def close(self) -> None:
        self._closed_log.close()

    async def handle(self, sock: socket.socket) -> None:
        """Serves one connection; closes it."""
        try:
            await self._serve(sock)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as error:
            log.debug("egress SOCKS connection ended: %s", error)
        except _Unsupported as error:
            log.debug("egress SOCKS connection refused: %s", error)
            if error.code is not None:
                with contextlib.suppress(OSError, TimeoutError):
                    await _send(sock, reply(error.code))
        finally:
            sock.close()

    async def busy(self, sock: socket.socket, most: int) -> None:
        """Closes a connection over the task's limit: SOCKS has no words to say why."""
        self._closed_log.say(f"egress SOCKS connection closed: the task has {most} open, its most")
        sock.close()

    async def _serve(self, sock: socket.socket) -> None:
        reader = SocketReader(sock)
        # The greeting and request are a few bytes; a client that sends nothing is not kept.
        async with asyncio.timeout(HEAD_SECONDS):
            await _greet(reader)
            command, target = await _request(reader)
        if command != CONNECT:
            what = _COMMANDS.get(command, f"command {command}")
            await self.on_refusal(
                str(target), f"SOCKS5 {what} is not supported; this proxy only connects (CONNECT)"
            )
            await _send(sock, reply(COMMAND_NOT_SUPPORTED))
            return
        told = FirstWords(sock, reply(SUCCEEDED))
        try:
            upstream = await self.dialer.open(target, told.send)
        except Refused as refusal:
            await self.on_refusal(str(target), str(refusal))
            await _send(sock, reply(NOT_ALLOWED))
            return
        except Unreachable as failure:
            log.debug("egress SOCKS target unreachable: %s", failure)
            code = HOST_UNREACHABLE
            if failure.code is not None:
                code = _UNREACHABLE_CODES.get(failure.code, HOST_UNREACHABLE)
            await _send(sock, reply(code))
            return
        try:
            # Bytes the client sent right after its request (pipelined) go first.
            await pipe(sock, upstream, to_task=told.unsent, to_upstream=reader.rest())
        finally:
            upstream.close()
