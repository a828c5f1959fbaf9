"""The HTTP proxy a task's HTTP_PROXY and HTTPS_PROXY point at: CONNECT tunnels and plain
HTTP requests with absolute URLs, each to a target the task's hosts allow.

One request per connection: after the head the proxy only copies bytes, so a refusal or an
error is always the first and last thing the task reads on that connection.
"""

import asyncio
import contextlib
import errno
import logging
import socket

from boxd.broker.egress.dial import Dialer, Refusal, Refused, Unreachable
from boxd.broker.egress.pipe import FirstWords, pipe
from boxd.broker.egress.proxy_request import BadRequest, parse_request, read_head
from boxd.broker.egress.socket_reader import SocketReader

log = logging.getLogger(__name__)

# After an error answer: how long, and in what reads, the proxy takes what the task still sends.
LINGER_SECONDS = 2.0
LINGER_READ = 64 * 1024

_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}


def answer(status: int, text: str, reason: str | None = None) -> bytes:
    body = (text + "\n").encode()
    head = (
        f"HTTP/1.1 {status} {reason or _REASONS[status]}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"


def tunnel_reason(status: int, text: str) -> str:
    """The status line's reason for a refused CONNECT: clients (Python's http.client, httpx,
    pip) show a tunnel's failure by its status line alone, never its body, so the words go there
    as well, in the printable ASCII a reason phrase may hold."""
    printable = "".join(c if " " <= c <= "~" else "?" for c in text)
    return f"{_REASONS[status]}: {printable}"


class HttpProxy:
    def __init__(self, dialer: Dialer, on_refusal: Refusal) -> None:
        self.dialer = dialer
        self.on_refusal = on_refusal

    async def handle(self, sock: socket.socket) -> None:
        """Serves one connection; closes it."""
        try:
            error = await self._serve(sock)
            if error is not None:
                await say(sock, *error)
        except OSError as failure:
            # The task hung up or reset: nothing is left to answer.
            log.debug("egress HTTP connection ended: %s", failure)
        finally:
            sock.close()

    async def busy(self, sock: socket.socket, most: int) -> None:
        """Answers a connection over the task's limit, without reading its request."""
        text = f"boxd's proxy has {most} connections of this task open, its most; close some"
        try:
            await say(sock, 503, text)
        except OSError as failure:
            log.debug("egress HTTP connection ended: %s", failure)
        finally:
            sock.close()

    async def _serve(self, sock: socket.socket) -> tuple[int, str, str | None] | None:
        """Serves one request; returns the error to answer (status, words, and the reason
        phrase when not the status's own), if it ends in one."""
        reader = SocketReader(sock)
        try:
            request = parse_request(await read_head(reader))
        except BadRequest as error:
            return error.status, f"boxd's proxy cannot serve this: {error}", None
        except TimeoutError:
            return 408, "boxd's proxy waited too long for the request head", None
        target = request.target
        told = FirstWords(sock, ESTABLISHED if request.connect else b"")
        try:
            upstream = await self.dialer.open(target, told.send)
        except Refused as refusal:
            await self.on_refusal(str(target), str(refusal))
            words = f"boxd refused {target}: {refusal}"
            return 403, words, tunnel_reason(403, words) if request.connect else None
        except Unreachable as failure:
            status = 504 if failure.code == errno.ETIMEDOUT else 502
            return status, f"boxd could not connect to {target}: {failure}", None
        try:
            # Bytes the task sent after the head (a TLS hello, a request body) go first.
            if request.connect:
                await pipe(sock, upstream, to_task=told.unsent, to_upstream=reader.rest())
            else:
                await pipe(sock, upstream, to_upstream=request.forward_head() + reader.rest())
        finally:
            upstream.close()
        return None


async def say(sock: socket.socket, status: int, text: str, reason: str | None = None) -> None:
    """Answers, then reads what the task still sends for a moment before the caller closes:
    closing with unread bytes makes the kernel send a reset, which can destroy the answer
    before the task reads it. A task that reads nothing gets LINGER_SECONDS, no more."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(LINGER_SECONDS):
            await loop.sock_sendall(sock, answer(status, text, reason))
            sock.shutdown(socket.SHUT_WR)
            while await loop.sock_recv(sock, LINGER_READ):
                pass
