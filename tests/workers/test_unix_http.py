"""The workers' HTTP client (boxd.workers.unix_http) against a broker whose answer is malformed:
each is refused as BrokerGarbled, in words, never as a Python error from deeper down."""

import asyncio
from pathlib import Path

import pytest

from boxd.workers.unix_http import LOST, BrokerGarbled, exchange
from tests.support.served_door import start


async def _answer_with(tmp_path: Path, answer: bytes) -> str:
    """What the client says of `answer`, sent by a broker to any request."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    path = str(tmp_path / "broker.sock")
    server = await asyncio.start_unix_server(serve, path)
    try:
        with pytest.raises(BrokerGarbled) as refused:
            await exchange(path, "GET", "/task", None)
    finally:
        server.close()
    return str(refused.value)


# "-1" made readexactly raise ValueError; the others int() took as numbers HTTP has no word for.
@pytest.mark.parametrize("size", [b"-1", b"-0", b"+1", b"0x1", b"1_0", b"", b"g"])
async def test_a_chunk_size_that_is_not_hex_digits_is_a_garbled_answer(
    tmp_path: Path, size: bytes
) -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer = head + size + b"\r\n{}\r\n0\r\n\r\n"
    words = await _answer_with(tmp_path, answer)
    assert words == f"the broker's answer has a bad chunk size: {size!r}"


async def test_a_chunked_answer_in_hex_digits_is_read(tmp_path: Path) -> None:
    path = str(tmp_path / "broker.sock")

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'A\r\n{"ok": 1}\r\n1;ext=1\r\n \r\n0\r\n\r\n'
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(serve, path)
    try:
        assert await exchange(path, "GET", "/task", None) == (200, {"ok": 1})
    finally:
        server.close()


async def test_one_request_is_http_1_1_and_asks_to_be_closed(tmp_path: Path) -> None:
    path = str(tmp_path / "broker.sock")
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(serve, path)
    try:
        assert await exchange(path, "GET", "/task", None) == (200, {})
    finally:
        server.close()
    assert heads[0].startswith(b"GET /task HTTP/1.1\r\n")
    assert b"\r\nConnection: close\r\n" in heads[0]


async def test_a_paged_answer_from_the_broker_s_server_is_read_whole(tmp_path: Path) -> None:
    door, server = await start(tmp_path)
    try:
        assert await exchange(door.path, "GET", "/paged", None) == (200, {"steps": [1, 2]})
    finally:
        await server.close()


async def test_a_paged_answer_cut_off_by_the_broker_s_server_is_lost_not_read(
    tmp_path: Path,
) -> None:
    """Were it sent as HTTP/1.0, the answer cut off after `[1, 2` would end with the connection
    and look whole: only its JSON being broken would give it away, and a cut between two pages
    not even that."""
    door, server = await start(tmp_path)
    try:
        with pytest.raises(LOST):
            await exchange(door.path, "GET", "/paged?cut", None)
    finally:
        await server.close()
