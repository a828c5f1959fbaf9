"""A door served by the broker's HTTP server on a Unix socket, as the broker's tests serve it."""

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

from boxd.broker.http_request import (
    Request,
)
from boxd.broker.http_server import Answer, HttpServer, Routes, json_answer
from boxd.doors.connection_limits import Bounds


class Served:
    def __init__(self, path: str) -> None:
        self.path = path
        self.seen: list[Request] = []
        self.finished: list[str] = []
        self.release = asyncio.Event()
        self.server: HttpServer | None = None

    async def echo(self, request: Request) -> Answer:
        self.seen.append(request)
        return json_answer({"body": request.body.decode("latin-1"), "query": request.head.query})

    async def slow(self, request: Request) -> Answer:
        await self.release.wait()
        self.finished.append("slow")
        return json_answer({"done": True})

    async def broken(self, request: Request) -> Answer:
        raise RuntimeError("/secret/insides")

    async def paged(self, request: Request) -> Answer:
        async def pieces() -> AsyncIterator[bytes]:
            yield b'{"steps": ['
            yield b"1, 2"
            if request.head.query == "cut":
                raise RuntimeError("the next page could not be read")
            yield b"]}"

        return Answer(200, pieces=pieces())

    def routes(self) -> Routes:
        return Routes(
            {
                "/echo": {"POST": self.echo, "GET": self.echo},
                "/slow": {"GET": self.slow},
                "/broken": {"GET": self.broken},
                "/paged": {"GET": self.paged},
            },
            lambda failure: 400,
            "this server serves /echo",
        )

    async def send(self, *pieces: bytes) -> bytes:
        """Sends the pieces one after the other, as long as the server reads, and reads until
        it closes."""
        return await asyncio.to_thread(self._send, pieces)

    def _send(self, pieces: tuple[bytes, ...]) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(self.path)
            for piece in pieces:
                try:
                    client.sendall(piece)
                except ConnectionError:
                    break  # refused and closed: what it said is read below
                time.sleep(0.01)
            got = b""
            try:
                while chunk := client.recv(65536):
                    got += chunk
            except ConnectionResetError:
                # The server closed with bytes of ours unread (the rest of a body it refused):
                # the kernel tells us once what it sent is read.
                pass
            return got


async def start(tmp_path: Path, bounds: Bounds | None = None) -> tuple[Served, HttpServer]:
    """A door served on a socket in tmp_path; the caller closes its server."""
    path = str(tmp_path / "broker.sock")
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(path)
    listening.listen()
    door = Served(path)
    server = HttpServer(door.routes(), bounds or Bounds(16))
    door.server = server
    await server.start([listening])
    return door, server
