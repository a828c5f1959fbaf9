"""A TCP forwarder from a listening socket it is handed to a port on 127.0.0.1, standard
library only, run by testbed/browser.py inside a test machine's network namespace:

    nsenter -t <leader> -n python3 testbed/port_forward.py <listening fd> <port>

A socket stays in the network namespace it was made in, so the listener (made on the host)
accepts the host's connections while each connection onward, made here, reaches the machine's
own 127.0.0.1, which a machine with --private-network shares with nothing else.
"""

from __future__ import annotations

import asyncio
import socket
import sys

# WebDriver is one client making a few connections; more than this means something is wrong.
MAX_CONNECTIONS = 32
CONNECT_TIMEOUT = 10.0
CHUNK = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


async def _forward(
    port: int,
    slots: asyncio.Semaphore,
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
) -> None:
    if slots.locked():
        client_writer.close()
        return
    async with slots:
        try:
            server_reader, server_writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError):
            client_writer.close()
            return
        try:
            await asyncio.gather(
                _pipe(client_reader, server_writer), _pipe(server_reader, client_writer)
            )
        finally:
            server_writer.close()
            client_writer.close()


async def serve(listener: socket.socket, port: int) -> None:
    slots = asyncio.Semaphore(MAX_CONNECTIONS)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _forward(port, slots, reader, writer)

    server = await asyncio.start_server(handle, sock=listener)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} LISTENING_FD PORT", file=sys.stderr)
        return 2
    listener = socket.socket(fileno=int(argv[1]))
    asyncio.run(serve(listener, int(argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
