"""Copying bytes both ways between a task's connection and the one the broker opened for it.

Each direction ends on its own: an end of stream from one side is passed on as a half-close
(TCP FIN), so a client that sends its request and shuts its side still gets the whole answer.
An error on either side ends both.
"""

import asyncio

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]

# Reads this big keep the loop's per-call cost small next to the bytes moved.
CHUNK = 256 * 1024
# Let a writer buffer this much before the copy waits for it, so a fast side is not held to
# the default 64 KiB.
WRITE_BUFFER = 256 * 1024


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(CHUNK):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()


# How long a closing connection may take to hand over what is still buffered.
CLOSE_SECONDS = 5.0


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        async with asyncio.timeout(CLOSE_SECONDS):
            await writer.wait_closed()
    except (OSError, TimeoutError):
        # A peer that stopped reading would hold the buffer, and this task, forever.
        writer.transport.abort()


async def pipe(one: Stream, other: Stream) -> None:
    """Copies until both directions ended, or one failed; closes both connections."""
    for _, writer in (one, other):
        writer.transport.set_write_buffer_limits(high=WRITE_BUFFER)
    copies = [
        asyncio.ensure_future(_copy(one[0], other[1])),
        asyncio.ensure_future(_copy(other[0], one[1])),
    ]
    try:
        # A failed direction returns at once; the other is cancelled below.
        await asyncio.wait(copies, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for copy in copies:
            copy.cancel()
        results = await asyncio.gather(*copies, return_exceptions=True)
        for result in results:
            # Resets and broken pipes are how connections end; anything else is a bug to see.
            if isinstance(result, Exception) and not isinstance(result, OSError):
                raise result
        await asyncio.gather(close(one[1]), close(other[1]))
