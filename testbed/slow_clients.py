"""Slow, silent and crowding clients against one of the box's doors, run inside a test machine
with the machine's own python3 (standard library only); prints what it measured as JSON.

    python3 slow_clients.py '{"door": "tcp:127.0.0.1:7700" | "unix:/path", "idle": 2000,
        "legit": "GET /... request head", "big": "GET /... head of a large answer",
        "post": "/path taking a body", "pid": <the server's pid, to count its descriptors>}'

All at once: `idle` connections that send nothing; one that sends nothing (half-open); one
sending its head a byte every 2 s (slowloris); one sending 10 bytes of a 1 MB body; one asking
for a large answer and reading none of it (its window shut). While they hang on, the legitimate
request is sent and timed. Every bad connection is watched, without reading, until the server
ends it (poll: hang-up or end of stream), and its time to that end is reported.
"""

import asyncio
import contextlib
import json
import os
import resource
import select
import socket
import sys
import time
from typing import Any

WATCH_SECONDS = 0.1
GIVE_UP_SECONDS = 120.0


def connect(door: str) -> socket.socket:
    kind, _, where = door.partition(":")
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(where)
    else:
        host, _, port = where.rpartition(":")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # A small window, so a large answer stops at once when it is not read.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
    sock.setblocking(False)
    return sock


def ended(sock: socket.socket) -> bool:
    """Whether the server ended the connection, seen without reading what it sent."""
    poller = select.poll()
    poller.register(sock, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    return any(
        event & (select.POLLRDHUP | select.POLLHUP | select.POLLERR) for _, event in poller.poll(0)
    )


async def until_ended(sock: socket.socket, started: float) -> float | None:
    while time.monotonic() - started < GIVE_UP_SECONDS:
        if ended(sock):
            return round(time.monotonic() - started, 2)
        await asyncio.sleep(WATCH_SECONDS)
    return None


async def half_open(door: str) -> dict[str, Any]:
    sock = connect(door)
    return {"closedAfter": await until_ended(sock, time.monotonic())}


async def slowloris(door: str, head: str) -> dict[str, Any]:
    sock = connect(door)
    started = time.monotonic()
    watching = asyncio.ensure_future(until_ended(sock, started))
    sent = 0
    for byte in head.encode()[:-2]:  # never the last line end
        if watching.done() or time.monotonic() - started > GIVE_UP_SECONDS:
            break
        try:
            sock.send(bytes([byte]))
            sent += 1
        except OSError:
            break
        await asyncio.sleep(2)
    return {"closedAfter": await watching, "bytesSent": sent}


async def slow_body(door: str, path: str, extra: str) -> dict[str, Any]:
    sock = connect(door)
    started = time.monotonic()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}Content-Type: application/json\r\n"
    sock.send(f'{head}Content-Length: 1000000\r\n\r\n{{"a": "123'.encode())
    closed = await until_ended(sock, started)
    answer = b""
    with contextlib.suppress(OSError):
        answer = sock.recv(65536)
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None
    return {"closedAfter": closed, "status": status, "answer": answer.decode("latin-1")[-300:]}


async def no_reader(door: str, head: str) -> dict[str, Any]:
    sock = connect(door)
    started = time.monotonic()
    sock.send(head.encode())
    return {"closedAfter": await until_ended(sock, started)}


async def legitimate(door: str, head: str) -> dict[str, Any]:
    kind, _, where = door.partition(":")
    started = time.monotonic()
    if kind == "unix":
        reader, writer = await asyncio.open_unix_connection(where)
    else:
        host, _, port = where.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head.encode())
    answer = await asyncio.wait_for(reader.read(), 30)
    took = round(time.monotonic() - started, 3)
    writer.close()
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None
    return {"status": status, "seconds": took}


def descriptors(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


async def steady(pid: int) -> float:
    """Seconds until the server's descriptors stop changing (for half a second)."""
    started = time.monotonic()
    before = None
    while time.monotonic() - started < 15:
        now = descriptors(pid)
        if now == before:
            break
        before = now
        await asyncio.sleep(0.5)
    return round(time.monotonic() - started, 2)


async def main(config: dict[str, Any]) -> dict[str, Any]:
    door = config["door"]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    pid = int(config.get("pid") or 0)
    before = descriptors(pid)
    started = time.monotonic()
    idle: list[socket.socket] = []
    refused = 0
    for _ in range(int(config["idle"])):
        try:
            idle.append(connect(door))
        except OSError:
            refused += 1
    flooded = round(time.monotonic() - started, 2)
    # A connect returns once the kernel queued the connection: the attackers below come after
    # the server took the whole flood, so they are its newest (at the cap, the oldest waiting
    # one makes room for a newcomer, and the bound of each attacker is what is measured).
    accepted = await steady(pid)
    extra = config.get("headers", "")
    attacks = {
        "halfOpen": asyncio.ensure_future(half_open(door)),
        "slowloris": asyncio.ensure_future(slowloris(door, config["legit"])),
        "slowBody": asyncio.ensure_future(slow_body(door, config["post"], extra)),
        "noReader": asyncio.ensure_future(no_reader(door, config["big"])),
    }
    await asyncio.sleep(1)  # every attacker connected and sending
    during = descriptors(pid)
    legit = await legitimate(door, config["legit"])
    idle_ended = [await until_ended(sock, started) for sock in idle]
    results = {name: await attack for name, attack in attacks.items()}
    closed = [t for t in idle_ended if t is not None]
    return {
        **results,
        "legitimate": legit,
        "idle": {
            "opened": len(idle),
            "refusedAtConnect": refused,
            "openingSeconds": flooded,
            "serverTookThemSeconds": accepted,
            "closed": len(closed),
            "lastClosedAfter": max(closed, default=None),
        },
        "serverDescriptors": {"before": before, "during": during, "after": descriptors(pid)},
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
