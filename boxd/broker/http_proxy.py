"""The HTTP proxy a task's HTTP_PROXY and HTTPS_PROXY point at: CONNECT tunnels and plain
HTTP requests with absolute URLs, each to a target the task's hosts allow.

One request per connection: after the head the proxy only copies bytes, so a refusal or an
error is always the first and last thing the task reads on that connection.
"""

import asyncio
import errno
import logging

from boxd.broker.egress_dial import Dialer, Refusal, Refused, Unreachable
from boxd.broker.pipe import close, pipe
from boxd.broker.proxy_request import BadRequest, parse_request, read_head

log = logging.getLogger(__name__)

_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}


def answer(status: int, text: str) -> bytes:
    body = (text + "\n").encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


class HttpProxy:
    def __init__(self, dialer: Dialer, on_refusal: Refusal) -> None:
        self.dialer = dialer
        self.on_refusal = on_refusal

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except OSError as error:
            # The task hung up or reset: nothing is left to answer.
            log.debug("egress HTTP connection ended: %s", error)
        finally:
            await close(writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = parse_request(await read_head(reader))
        except BadRequest as error:
            writer.write(answer(error.status, f"boxd's proxy cannot serve this: {error}"))
            await writer.drain()
            return
        except TimeoutError:
            writer.write(answer(408, "boxd's proxy waited too long for the request head"))
            await writer.drain()
            return
        target = request.target
        try:
            upstream = await self.dialer.open(target)
        except Refused as refusal:
            await self.on_refusal(str(target), str(refusal))
            writer.write(answer(403, f"boxd refused {target}: {refusal}"))
            await writer.drain()
            return
        except Unreachable as failure:
            status = 504 if failure.code == errno.ETIMEDOUT else 502
            writer.write(answer(status, f"boxd could not connect to {target}: {failure}"))
            await writer.drain()
            return
        try:
            if request.connect:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream[1].write(request.forward_head())
            await pipe((reader, writer), upstream)
        finally:
            await close(upstream[1])
