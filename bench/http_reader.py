"""CPU time the broker's request reader (boxd/broker/http_request.py) spends on what a hostile
task can trickle down its socket: a head a byte at a time up to LONGEST_HEAD, a body a byte at a
time and in 1-byte chunks up to MAX_BODY. Each read is one `feed` and one `next`, as the server
does on each `data_received`. Linear means the time per KiB stays flat as the size grows.

Run from the repository: `python -m bench.http_reader` (a few seconds, no machine needed).
"""

import time

from boxd.broker.http_request import LONGEST_HEAD, RequestReader
from boxd.reading.strict_json import MAX_BODY


def _cpu(reader: RequestReader, pieces: list[bytes]) -> float:
    started = time.process_time()
    for piece in pieces:
        reader.feed(piece)
        reader.next()
    return time.process_time() - started


def head_bytewise(size: int) -> float:
    line = b"X-Padding: aaaaaaa\r\n"
    head = b"GET /task HTTP/1.1\r\n" + line * ((size - 20) // len(line))
    return _cpu(RequestReader(), [head[at : at + 1] for at in range(len(head))])


def body_bytewise(size: int) -> float:
    reader = RequestReader()
    reader.feed(b"POST /step HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % size)
    reader.next()
    return _cpu(reader, [b"a"] * size)


def body_tiny_chunks(size: int) -> float:
    reader = RequestReader()
    reader.feed(b"POST /step HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    reader.next()
    return _cpu(reader, [b"1\r\na\r\n"] * size)


def main() -> None:
    for name, measure, sizes in (
        ("head, a byte per read", head_bytewise, (LONGEST_HEAD // 4, LONGEST_HEAD)),
        ("body, a byte per read", body_bytewise, (MAX_BODY // 10, MAX_BODY)),
        ("body, 1-byte chunks", body_tiny_chunks, (MAX_BODY // 100, MAX_BODY // 10)),
    ):
        for size in sizes:
            seconds = measure(size)
            print(
                f"{name:24} {size / 1024:>9.0f} KiB  {seconds:7.3f} s CPU  "
                f"{seconds / size * 1024 * 1e6:7.1f} µs per KiB"
            )


if __name__ == "__main__":
    main()
