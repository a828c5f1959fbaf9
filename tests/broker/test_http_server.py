"""The broker's own HTTP server (boxd/broker/http_server.py, boxd/broker/http_request.py) against
what a hostile task sends down its broker socket: requests smuggled with two lengths, heads and
bodies too big, chunks that lie, bytes where a header should be, a client that hangs up while its
request is in hand. Real Unix sockets, raw bytes; tests/doors/test_connection_guard.py has the slow
and crowding clients, tests/broker/test_fuzz_broker.py the bodies."""

import asyncio
import contextlib
import gc
import itertools
import json
import logging
import operator
import select
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import SupportsIndex

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typing_extensions import Buffer

from boxd.broker.http_request import (
    LINE_TOO_LONG,
    LONGEST_LINE,
    Head,
    Refusal,
    Request,
    RequestReader,
)
from boxd.broker.http_server import json_answer, whole_answer
from boxd.doors.connection_limits import Bounds
from boxd.reading.strict_json import MAX_BODY, TOO_LARGE
from tests.support.http_answers import status_of
from tests.support.served_door import Served, start

TOO_LONG = LINE_TOO_LONG.words


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    door, server = await start(tmp_path)
    yield door
    door.release.set()
    await server.close()


def answers(raw: bytes) -> list[tuple[int, object]]:
    """Each answer on a connection: its status and JSON body (all of them have a length)."""
    found = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        length = int(head.lower().partition(b"content-length: ")[2].split(b"\r\n")[0])
        found.append((status_of(head), json.loads(rest[:length])))
        raw = rest[length:]
    return found


def refused(raw: bytes) -> tuple[int, str]:
    [(status, body)] = answers(raw)
    assert isinstance(body, dict)
    return status, body["error"]


# --- the attacker's tests -----------------------------------------------------------------------


async def test_a_request_smuggled_with_two_lengths_is_refused_and_the_connection_closed(
    served: Served,
) -> None:
    raw = await served.send(
        b"POST /echo HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"0\r\n\r\nGET /echo HTTP/1.1\r\n\r\n"
    )
    assert refused(raw) == (
        400,
        "the request gives both Content-Length and Transfer-Encoding: send one of them",
    )
    assert served.seen == []


@pytest.mark.parametrize("name", ["Content-Length", "Host", "Transfer-Encoding"])
async def test_a_header_read_once_given_twice_is_refused(served: Served, name: str) -> None:
    raw = await served.send(f"GET /echo HTTP/1.1\r\n{name}: 0\r\n{name}: 0\r\n\r\n".encode())
    assert refused(raw) == (
        400,
        f"the request sends its {name} header more than once: send it once",
    )


@pytest.mark.parametrize(
    ("head", "status", "words"),
    [
        (
            b"GET /echo HTTP/1.1\r\nX: " + b"a" * LONGEST_LINE + b"\r\n\r\n",
            400,
            LINE_TOO_LONG.words,
        ),
        (b"GET /" + b"a" * LONGEST_LINE + b" HTTP/1.1\r\n\r\n", 400, TOO_LONG),
        (
            b"GET /echo HTTP/1.1\r\n" + b"X: a\r\n" * 101 + b"\r\n",
            431,
            "the request has too many headers, or headers too long",
        ),
        (b"GET /echo HTTP/1.1\r\nX: a\rb\r\n\r\n", 400, "a header of the request cannot be read"),
        (b"GET /echo HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400, "a header of the request cannot be read"),
        (b"GET /echo HTTP/1.1\r\n folded\r\n\r\n", 400, "a header of the request cannot be read"),
        (b"get /echo HTTP/1.1\r\n\r\n", 400, "the request does not start with an HTTP method"),
        (b"GET /echo HTTP/2.0\r\n\r\n", 400, "the request is not HTTP/1.1 this server can read"),
        (b"GET http://x/echo HTTP/1.1\r\n\r\n", 400, "the request's address cannot be read"),
        (b"GET /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "the request's Content-Length"),
        (b"GET /echo HTTP/1.1\r\nContent-Length: \xd9\xa3\r\n\r\n", 400, "the request's Content"),
        (b"POST /echo HTTP/1.1\r\nContent-Encoding: gzip\r\n\r\n", 400, "the broker reads bodies"),
        (b"POST /echo HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 400, "the only Transfer-"),
    ],
)
async def test_a_head_that_cannot_be_read_is_refused_in_words(
    served: Served, head: bytes, status: int, words: str
) -> None:
    got = refused(await served.send(head))
    assert got[0] == status and got[1].startswith(words), got
    assert served.seen == []


async def test_a_body_over_the_cap_is_refused_before_it_is_sent(served: Served) -> None:
    head = f"POST /echo HTTP/1.1\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n".encode()
    assert refused(await served.send(head)) == (413, TOO_LARGE)


async def test_a_chunked_body_over_the_cap_is_refused_as_it_grows(served: Served) -> None:
    chunk = b"%x\r\n%b\r\n" % (1024 * 1024, b"a" * 1024 * 1024)
    raw = await served.send(
        b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", *[chunk] * 12
    )
    assert refused(raw) == (413, TOO_LARGE)
    assert served.seen == []


@pytest.mark.parametrize("size", [b"-1", b"zz", b"", b"1 1", b"123456789"])
async def test_a_chunk_that_lies_about_its_size_is_refused(served: Served, size: bytes) -> None:
    raw = await served.send(
        b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\nab\r\n0\r\n\r\n"
    )
    status, words = refused(raw)
    assert status in (400, 413) and words.startswith(("the body's chunks", "the body is over"))


async def test_a_handler_that_fails_says_so_without_its_insides(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        raw = await served.send(b"GET /broken HTTP/1.1\r\nConnection: close\r\n\r\n")
    status, words = refused(raw)
    assert status == 500 and "/secret" not in words and "journal" in words
    assert "/secret/insides" in caplog.text


async def test_a_client_that_hangs_up_does_not_cut_its_request_short(served: Served) -> None:
    _, writer = await asyncio.open_unix_connection(served.path)
    writer.write(b"GET /slow HTTP/1.1\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()
    await asyncio.sleep(0.05)
    served.release.set()
    for _ in range(100):
        if served.finished:
            break
        await asyncio.sleep(0.01)
    assert served.finished == ["slow"]


async def test_requests_sent_without_reading_the_answers_do_not_pile_up_in_memory(
    served: Served,
) -> None:
    """A client that sends requests as fast as it can and reads none of the answers: the next
    request is read only once the last answer is on its way, so what waits for it is bounded
    (the rest of its requests wait in the kernel), not a copy of every answer it asked for."""
    assert served.server is not None
    request = b"GET /echo?" + b"q" * 200 + b" HTTP/1.1\r\n\r\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(served.path)
        client.setblocking(False)
        sent = 0
        most = 0
        for _ in range(400):
            try:
                while sent < 8 * 1024 * 1024:
                    sent += client.send(request * 64)
            except BlockingIOError:
                pass
            await asyncio.sleep(0.005)
            [connection] = served.server._listening.listeners[0].open
            assert connection.transport is not None
            most = max(most, connection.transport.get_write_buffer_size())
        assert sent > 4 * 1024 * 1024 or most > 0, sent
        assert most < 1024 * 1024, f"{most} bytes of answers held for a client that reads none"


async def test_a_client_that_hangs_up_on_a_large_answer_leaves_no_error_in_the_journal(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """An answer too large for the socket's buffer, its client gone without reading it: nothing
    is logged (an error line per such connection would let a task fill the journal)."""
    body = b"x" * (4 * 1024 * 1024)
    request = (
        b"POST /echo HTTP/1.1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )

    def hang_up() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(served.path)
            client.sendall(request)
            client.recv(10)
            time.sleep(0.1)

    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            await asyncio.to_thread(hang_up)
            await asyncio.sleep(0.1)
        gc.collect()
        await asyncio.sleep(0.1)
    assert caplog.text == ""


# --- what clients send ---------------------------------------------------------------------------


async def test_requests_sent_together_are_answered_in_turn(served: Served) -> None:
    raw = await served.send(
        b"POST /echo HTTP/1.1\r\nContent-Length: 1\r\n\r\na"
        b"POST /echo?x=1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"1\r\nb\r\n1;ext\r\nc\r\n0\r\n"
        b"Trailer: t\r\n\r\n"
        b"GET /echo HTTP/1.1\r\nConnection: close\r\n\r\n"
    )
    assert answers(raw) == [
        (200, {"body": "a", "query": ""}),
        (200, {"body": "bc", "query": "x=1"}),
        (200, {"body": "", "query": ""}),
    ]


async def test_connections_read_into_one_buffer_each_get_their_own_bytes(served: Served) -> None:
    # Every connection's reads land in one buffer of the server's (_READS), copied out at once:
    # two tasks' halves sent in turn, and bodies larger than the buffer, stay each their own.
    size = 12 * 16 * 1024 + 5
    bodies = [bytes([ord("a") + n]) * size for n in range(2)]
    writers = []
    readers = []
    for _ in bodies:
        reader, writer = await asyncio.open_unix_connection(served.path)
        readers.append(reader)
        writers.append(writer)
    wholes = [
        b"POST /echo HTTP/1.1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%b" % (size, body)
        for body in bodies
    ]
    for at in range(0, len(wholes[0]), 40_000):
        for whole, writer in zip(wholes, writers, strict=True):
            writer.write(whole[at : at + 40_000])
            await writer.drain()
        await asyncio.sleep(0)
    got = [answers(await reader.read()) for reader in readers]
    assert got == [[(200, {"body": body.decode(), "query": ""})] for body in bodies]
    for writer in writers:
        writer.close()


async def test_a_client_waiting_for_100_continue_gets_it(served: Served) -> None:
    reader, writer = await asyncio.open_unix_connection(served.path)
    writer.write(b"POST /echo HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == (
        b"HTTP/1.1 100 Continue\r\n\r\n"
    )
    writer.write(b"hi")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert status_of(head) == 200
    writer.close()


async def test_http_1_0_is_closed_after_its_answer(served: Served) -> None:
    raw = await served.send(b"GET /echo HTTP/1.0\r\n\r\n")
    assert answers(raw) == [(200, {"body": "", "query": ""})]
    assert b"Connection: close" in raw


async def test_http_1_0_asking_to_be_kept_alive_is_answered_and_closed(served: Served) -> None:
    """The answer to an HTTP/1.0 client that asks for keep-alive says whether the connection
    stays: without a word it waits for the close, held until the head rule ends it."""
    raw = await served.send(b"GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    assert answers(raw) == [(200, {"body": "", "query": ""})]
    assert b"Connection: close" in raw


async def test_a_paged_answer_is_chunked_to_http_1_1(served: Served) -> None:
    raw = await served.send(b"GET /paged HTTP/1.1\r\nConnection: close\r\n\r\n")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in head
    assert body == b'b\r\n{"steps": [\r\n4\r\n1, 2\r\n2\r\n]}\r\n0\r\n\r\n'


async def test_a_paged_answer_to_http_1_0_is_not_chunked_and_ends_with_the_connection(
    served: Served,
) -> None:
    """HTTP/1.0 has no chunks: a client of it would read the chunk sizes as the body."""
    raw = await served.send(b"GET /paged HTTP/1.0\r\n\r\n")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding" not in head
    assert b"Connection: close" in head
    assert json.loads(body) == {"steps": [1, 2]}


async def test_a_paged_answer_cut_off_is_not_ended_as_a_whole_one(served: Served) -> None:
    """The last chunk is never sent after a failure, so an HTTP/1.1 client tells the answer
    cut off from a whole one."""
    raw = await served.send(b"GET /paged?cut HTTP/1.1\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 200")
    assert not raw.endswith(b"0\r\n\r\n")


# --- the reader alone ---------------------------------------------------------------------------


class CountingBuffer(bytearray):
    """A reader's buffer that counts the bytes its searches look at."""

    looked = 0

    def find(
        self,
        sub: Buffer | SupportsIndex,
        start: SupportsIndex | None = None,
        end: SupportsIndex | None = None,
        /,
    ) -> int:
        begin = 0 if start is None else operator.index(start)
        self.looked += len(self) - begin
        return super().find(sub, start, end)


def test_a_head_sent_a_byte_at_a_time_is_searched_once() -> None:
    """A head trickled in a byte at a time (each byte its own read) is looked through once, not
    once per byte: 64 KiB of it cost the broker 5.6 s of CPU when each byte meant searching the
    whole head again for its end. bench/http_reader.py prints the CPU time it costs."""
    reader = RequestReader()
    buffer = reader.buffer = CountingBuffer()
    head = b"GET /echo HTTP/1.1\r\n" + b"X-Padding: aaaaaaa\r\n" * 800
    for byte in head:
        reader.feed(bytes([byte]))
        assert reader.next() is None
    assert buffer.looked < 20 * len(head), f"{buffer.looked} bytes looked at for {len(head)}"


def read_all(pieces: list[bytes]) -> list[Head | Request] | Refusal:
    reader = RequestReader()
    got: list[Head | Request] = []
    try:
        for piece in pieces:
            reader.feed(piece)
            while (found := reader.next()) is not None:
                got.append(found)
    except Refusal as refusal:
        return refusal
    return got


def shape(result: list[Head | Request] | Refusal) -> object:
    if isinstance(result, Refusal):
        return (result.status, result.words)
    return [(found.path, found.body) if isinstance(found, Request) else found for found in result]


REQUESTS = st.sampled_from(
    [
        b"GET /task HTTP/1.1\r\nHost: box\r\n\r\n",
        b'POST /step HTTP/1.1\r\nContent-Length: 12\r\n\r\n{"text": 1}\n',
        b"POST /step HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        b"POST /x HTTP/1.1\nContent-Length: 1\n\nz",
    ]
)


@given(
    requests=st.lists(REQUESTS | st.binary(max_size=60), max_size=4),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_what_is_read_does_not_depend_on_how_the_bytes_came(
    requests: list[bytes], cuts: list[int]
) -> None:
    """Whole or cut anywhere, the same bytes give the same requests, or the same refusal."""
    sent = b"".join(requests)
    at = sorted({min(cut, len(sent)) for cut in cuts} | {0, len(sent)})
    pieces = [sent[start:end] for start, end in itertools.pairwise(at)]
    whole = read_all([sent])
    assert shape(read_all(pieces)) == shape(whole)
    assert shape(read_all([bytes([byte]) for byte in sent])) == shape(whole)


async def test_a_request_whose_body_never_comes_is_ended_even_if_its_408_cannot_be_sent(
    tmp_path: Path,
) -> None:
    """The attacker fills the socket's buffer with answers it does not read, exactly (it can
    measure its kernel's buffer on a socket pair of its own), then sends a head whose body never
    comes. The broker's 408 cannot be sent: the connection must still end, not hang on for good
    outside the cap, its descriptor held and the broker kept from ever being idle."""
    limits = Bounds(16, head_seconds=5, body_seconds=0.2, stall_seconds=0.5, check_seconds=0.05)
    door, server = await start(tmp_path, limits)
    path = door.path
    body = "b" * 20_000
    answer = whole_answer(json_answer({"body": body, "query": ""}), True)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.setblocking(False)
        fit = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                ours.send(answer)
                fit += 1
    request = b"POST /echo HTTP/1.1\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body.encode())
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)
            await asyncio.to_thread(
                client.sendall, request * fit + b"POST /echo HTTP/1.1\r\nContent-Length: 1\r\n\r\n"
            )
            for _ in range(100):
                if server.dropped:
                    break
                await asyncio.sleep(0.05)
            assert server.dropped == {"no whole body in time": 1}
            hung_up = select.poll()
            hung_up.register(client, select.POLLHUP)
            for _ in range(60):
                if hung_up.poll(0):
                    break
                await asyncio.sleep(0.05)
            assert hung_up.poll(0), "the connection is still held by the broker"
    finally:
        await server.close()


async def test_a_request_sent_behind_one_in_hand_is_not_started_once_the_broker_stops(
    tmp_path: Path,
) -> None:
    """A stopping broker gives the request in hand time to be answered. One the task sent behind
    it must not be started then (it would run past on_close, and be cut by the loop's end
    halfway): the connection closes after the answer in hand, nothing of the next one done."""
    door, server = await start(tmp_path)
    path = door.path
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"GET /slow HTTP/1.1\r\n\r\nPOST /echo HTTP/1.1\r\nContent-Length: 1\r\n\r\na")
    await writer.drain()
    await asyncio.sleep(0.1)
    closing = asyncio.create_task(server.close())
    await asyncio.sleep(0.1)
    door.release.set()
    await asyncio.wait_for(closing, 10)
    raw = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert door.finished == ["slow"] and door.seen == []
    got = answers(raw)
    # Its answer says the connection closes: the task sends the next one again, elsewhere.
    assert got == [(200, {"done": True})] and b"Connection: close" in raw


async def test_a_body_finished_while_the_broker_stops_is_answered_503_nothing_done(
    tmp_path: Path,
) -> None:
    door, server = await start(tmp_path)
    path = door.path
    _, holding = await asyncio.open_unix_connection(path)
    holding.write(b"GET /slow HTTP/1.1\r\n\r\n")
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"POST /echo HTTP/1.1\r\nContent-Length: 1\r\n\r\n")
    await asyncio.sleep(0.1)
    closing = asyncio.create_task(server.close())
    await asyncio.sleep(0.1)
    writer.write(b"a")
    raw = await asyncio.wait_for(reader.read(), 5)
    door.release.set()
    await asyncio.wait_for(closing, 10)
    writer.close()
    holding.close()
    assert door.seen == []
    assert refused(raw) == (
        503,
        "the broker is stopping; nothing of this request was done: send it again",
    )
