"""Reading the first bytes of a proxy connection (a request head, a SOCKS greeting) straight from
its socket, with the event loop's sock_recv: no transport or stream to build for a connection
whose bytes, once it is a tunnel, never pass through Python again (boxd.broker.egress.pipe).

Whatever was read past what the proxy asked for is kept, and handed to the tunnel to send first.
"""

import asyncio
import socket

# One read; a request head or a greeting is far smaller.
READ = 64 * 1024


class SocketReader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.at_eof = False

    async def more(self) -> bool:
        """Reads what the socket has into the buffer; False at the end of stream."""
        if self.at_eof:
            return False
        data = await asyncio.get_running_loop().sock_recv(self.sock, READ)
        if not data:
            self.at_eof = True
            return False
        self.buffer += data
        return True

    async def readexactly(self, count: int) -> bytes:
        """`count` bytes; asyncio.IncompleteReadError if the stream ends first."""
        while len(self.buffer) < count:
            if not await self.more():
                raise asyncio.IncompleteReadError(bytes(self.buffer), count)
        data = bytes(self.buffer[:count])
        del self.buffer[:count]
        return data

    def rest(self) -> bytes:
        """What was read and not taken yet; the buffer is left empty."""
        data = bytes(self.buffer)
        self.buffer.clear()
        return data
