"""How much a task's egress proxy costs: a 100 MB download and connection set-up through boxd's
HTTP proxy (boxd.broker.egress.proxies), next to the same without a proxy, and, when it is
installed, through the HTTP proxy of Anthropic's sandbox runtime (`@anthropic-ai/sandbox-runtime`,
srt).

Run from the repository: `python -m bench.egress` (add `--srt DIR`, the folder `npm install
@anthropic-ai/sandbox-runtime` was run in, to include srt; without it, it looks in
/tmp/srt and ./node_modules). It needs no root and no systemd: it runs on the host, each part in
a process of its own, all on 127.0.0.1:

- the origin: a threaded HTTP server that answers `GET /big` with 100 MB and `GET /small` with
  two bytes, one request per connection;
- boxd's egress: `Egress(["origin.example"], ...).serve_http` on a socket this bench binds
  (in production systemd binds it in the task's network namespace). Its resolver maps
  origin.example to 127.0.0.1 and its address check lets loopback through, which production
  never does; the box's own addresses are read from /proc for every connection as in
  production (at most once a second, less 127.0.0.1), so that cost is in the figures;
- srt's proxy: `createHttpProxyServer` from the package, started standalone by
  bench/srt_proxy.mjs with a filter that allows origin.example and a lookup that maps it to
  127.0.0.1 (so srt's resolved-address guard, which refuses loopback, is not in its path
  either);
- the least tunnel: no proxy at all, only what any user-space proxy must do once a tunnel is
  open. Two threads per connection, each moving one direction with blocking splice(2) through a
  1 MiB pipe: no event loop, no check, two system calls per pipe-full, no byte through user
  space. It bounds what any proxy in user space, boxd's included, can reach on this machine;
- the client, this process: blocking sockets, one connection at a time.

Printed: for each way to the origin, the median time of DOWNLOADS downloads of 100 MB, MB/s,
and the ratio to direct (the least tunnel downloads only: its set-up, a thread per direction,
says nothing of a proxy's); then connection set-up (TCP connect, or connect + CONNECT + the
proxy's 200) and a small GET round trip, p50 and p90 over SETUPS tries each, with ratios; last
the issue's goals as ratios (100 MB through boxd / direct, CONNECT set-up boxd / srt), and how
near boxd's tunnel comes to the least one. The
ways take turns within each round, so drift in the machine's speed touches all alike.
"""

import argparse
import asyncio
import fcntl
import ipaddress
import json
import os
import shutil
import socket
import socketserver
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

NAME = "origin.example"
BIG = 100 * 1000 * 1000
DOWNLOADS = 5
SETUPS = 300
WARM_UP = 20
CHUNK = 1024 * 1024
SOCKET_SECONDS = 60.0
ROOT = Path(__file__).resolve().parents[1]
SRT_PACKAGE = Path("node_modules", "@anthropic-ai", "sandbox-runtime")


def say(line: str) -> None:
    print(line, flush=True)


# --- the origin, in its own process -------------------------------------------------------------


def request_target(sock: socket.socket) -> bytes | None:
    """The target of the request a server's client sends (its path, or CONNECT's host:port);
    None if it hangs up first."""
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(65536)
        if not data:
            return None
        head += data
    return head.split(b" ", 2)[1]


class Origin(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        path = request_target(sock)
        if path is None:
            return
        if path == b"/big":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % BIG)
            block = memoryview(bytes(range(256)) * (CHUNK // 256))
            left = BIG
            while left:
                sent = min(left, len(block))
                sock.sendall(block[:sent])
                left -= sent
        else:
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")


class OriginServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    request_queue_size = 128


def serve_origin() -> None:
    with OriginServer(("127.0.0.1", 0), Origin) as server:
        print(json.dumps({"port": server.server_address[1]}), flush=True)
        server.serve_forever()


# --- boxd's egress, in its own process ----------------------------------------------------------


async def serve_egress() -> None:
    from boxd.broker.egress.own_addresses import RecentOwnAddresses
    from boxd.broker.egress.proxies import Egress, IPAddress
    from boxd.net.address_screen import never_reached

    loopback = ipaddress.IPv4Address("127.0.0.1")

    async def resolve(name: str, port: int) -> list[IPAddress]:
        if name != NAME:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [loopback]

    recent = RecentOwnAddresses()

    async def own() -> set[IPAddress]:
        return await recent() - {loopback}

    def loopback_allowed(address: IPAddress) -> str | None:
        return None if address == loopback else never_reached(address)

    async def on_refusal(target: str, reason: str) -> None:
        print(f"refused {target}: {reason}", file=sys.stderr, flush=True)

    egress = Egress(
        [NAME], on_refusal, resolver=resolve, own_addresses=own, address_check=loopback_allowed
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    await egress.serve_http(sock)
    print(json.dumps({"port": sock.getsockname()[1]}), flush=True)
    await asyncio.Event().wait()


# --- the least tunnel, in its own process ------------------------------------------------------

LEAST_PIPE = 1024 * 1024
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, which Python 3.11 does not name


def splice_one_way(src: socket.socket, dst: socket.socket) -> None:
    read_end, write_end = os.pipe()
    try:
        fcntl.fcntl(write_end, _F_SETPIPE_SZ, LEAST_PIPE)
        while count := os.splice(src.fileno(), write_end, LEAST_PIPE, flags=os.SPLICE_F_MOVE):
            while count:
                count -= os.splice(read_end, dst.fileno(), count, flags=os.SPLICE_F_MOVE)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the other side hung up: the client has what it will get
    finally:
        os.close(read_end)
        os.close(write_end)


class LeastTunnel(socketserver.BaseRequestHandler):
    """CONNECT origin.example:PORT, answered 200, then both directions spliced."""

    def handle(self) -> None:
        client: socket.socket = self.request
        target = request_target(client)
        if target is None:
            return
        port = int(target.rsplit(b":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as upstream:
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            back = threading.Thread(target=splice_one_way, args=(upstream, client))
            back.start()
            splice_one_way(client, upstream)
            back.join()


def serve_least_tunnel() -> None:
    with OriginServer(("127.0.0.1", 0), LeastTunnel) as server:
        print(json.dumps({"port": server.server_address[1]}), flush=True)
        server.serve_forever()


# --- the client, this process -------------------------------------------------------------------


def read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The answer's head and what came after it in the same reads."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            sys.exit(f"the connection closed before an answer's head; got {data[:200]!r}")
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    if not head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
        sys.exit(f"answered {head[:300]!r}")
    return head, rest


def connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=SOCKET_SECONDS)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def tunnel(proxy: tuple[str, int], origin: int) -> socket.socket:
    sock = connect(proxy)
    sock.sendall(f"CONNECT {NAME}:{origin} HTTP/1.1\r\nHost: {NAME}:{origin}\r\n\r\n".encode())
    _, rest = read_head(sock)
    if rest:
        sys.exit(f"bytes after the CONNECT answer: {rest[:100]!r}")
    return sock


def get(sock: socket.socket, target: str, origin: int) -> int:
    """Sends a GET, reads the whole answer; returns the body's size."""
    request = f"GET {target} HTTP/1.1\r\nHost: {NAME}:{origin}\r\nConnection: close\r\n\r\n"
    sock.sendall(request.encode())
    head, rest = read_head(sock)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    got = len(rest)
    buffer = bytearray(CHUNK)
    while got < length:
        count = sock.recv_into(buffer)
        if not count:
            sys.exit(f"the body ended after {got} of {length} bytes")
        got += count
    return got


# How a client reaches the origin: a socket ready for a request, and the request's target.
Way = Callable[[str], tuple[socket.socket, str]]


LEAST = "least tunnel"


def ways(origin: int, boxd: int, least: int, srt: int | None) -> dict[str, Way]:
    local = ("127.0.0.1", origin)
    url = f"http://{NAME}:{origin}"
    found: dict[str, Way] = {
        "direct": lambda path: (connect(local), path),
        LEAST: lambda path: (tunnel(("127.0.0.1", least), origin), path),
        "boxd plain HTTP": lambda path: (connect(("127.0.0.1", boxd)), url + path),
        "boxd CONNECT": lambda path: (tunnel(("127.0.0.1", boxd), origin), path),
    }
    if srt is not None:
        found["srt plain HTTP"] = lambda path: (connect(("127.0.0.1", srt)), url + path)
        found["srt CONNECT"] = lambda path: (tunnel(("127.0.0.1", srt), origin), path)
    return found


def fetch(way: Way, path: str, origin: int) -> int:
    sock, target = way(path)
    with sock:
        return get(sock, target, origin)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def downloads(routes: dict[str, Way], origin: int, rounds: int) -> dict[str, float]:
    """Prints the table; returns each way's median seconds."""
    seconds: dict[str, list[float]] = {name: [] for name in routes}
    for _ in range(rounds):
        for name, way in routes.items():
            began = time.perf_counter()
            size = fetch(way, "/big", origin)
            seconds[name].append(time.perf_counter() - began)
            if size != BIG:
                sys.exit(f"{name}: got {size} bytes, not {BIG}")
    say("")
    say(f"download of {BIG // 1_000_000} MB, median of {rounds}, one connection at a time")
    say(f"{'way':<18} {'seconds':>8} {'MB/s':>8} {'speed/direct':>12}")
    direct = statistics.median(seconds["direct"])
    for name, values in seconds.items():
        median = statistics.median(values)
        rate = BIG / 1e6 / median
        say(f"{name:<18} {median:>8.3f} {rate:>8.0f} {direct / median:>12.2f}")
    return {name: statistics.median(values) for name, values in seconds.items()}


def setups(
    routes: dict[str, Way], proxies: dict[str, tuple[str, int]], origin: int, n: int
) -> dict[str, float]:
    """Prints the table; returns each measure's p50 in seconds."""
    local = ("127.0.0.1", origin)
    opens: dict[str, Callable[[], socket.socket]] = {"direct TCP connect": lambda: connect(local)}
    for name, proxy in proxies.items():
        opens[f"{name} CONNECT"] = partial(tunnel, proxy, origin)
    gets = {name: way for name, way in routes.items() if "CONNECT" not in name and name != LEAST}
    samples: dict[str, list[float]] = {name: [] for name in [*opens, *gets]}
    for number in range(-WARM_UP, n):
        for name, open_ in opens.items():
            began = time.perf_counter()
            sock = open_()
            elapsed = time.perf_counter() - began
            sock.close()
            if number >= 0:
                samples[name].append(elapsed)
        for name, way in gets.items():
            began = time.perf_counter()
            fetch(way, "/small", origin)
            if number >= 0:
                samples[name].append(time.perf_counter() - began)
    say("")
    say(f"connection set-up and a small GET, {n} each after {WARM_UP} unmeasured, in µs")
    say(f"{'what':<26} {'p50':>8} {'p90':>8} {'p50 ratio to direct':>20}")
    for group, reference in ((opens, "direct TCP connect"), (gets, "direct")):
        base = percentile(samples[reference], 0.5)
        for name in group:
            label = f"{name} GET /small" if group is gets else name
            p50 = percentile(samples[name], 0.5)
            p90 = percentile(samples[name], 0.9)
            say(f"{label:<26} {p50 * 1e6:>8.0f} {p90 * 1e6:>8.0f} {p50 / base:>20.2f}")
    return {name: percentile(values, 0.5) for name, values in samples.items()}


def goals(speed: dict[str, float], setup: dict[str, float]) -> None:
    """The issue's two egress goals as ratios: 100 MB through boxd at >= 0.8 of direct, and a
    CONNECT's set-up p50 no slower than srt's in the same run."""
    say("")
    say("goals")
    for way in ("boxd CONNECT", "boxd plain HTTP"):
        ratio = speed["direct"] / speed[way]
        say(f"  100 MB speed, {way} / direct: {ratio:.2f} (goal >= 0.80)")
    # The bound on the goal above: what a user-space tunnel reaches here at the least cost.
    bound = speed["direct"] / speed[LEAST]
    say(f"  100 MB speed, {LEAST} / direct: {bound:.2f} (the most a user-space tunnel reaches)")
    say(f"  100 MB speed, boxd CONNECT / {LEAST}: {speed[LEAST] / speed['boxd CONNECT']:.2f}")
    if "srt CONNECT" in setup:
        ratio = setup["boxd CONNECT"] / setup["srt CONNECT"]
        say(f"  CONNECT set-up p50, boxd / srt: {ratio:.2f} (goal <= 1.00)")
        ratio = speed["srt CONNECT"] / speed["boxd CONNECT"]
        say(f"  100 MB speed, boxd CONNECT / srt CONNECT: {ratio:.2f}")


def start(command: list[str], what: str) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    # The first line is {"port": N} once it listens; nothing if it failed and exited.
    line = process.stdout.readline()
    if not line:
        process.kill()
        sys.exit(f"{what} did not start: {' '.join(command)}")
    port: int = json.loads(line)["port"]
    return process, port


def find_srt(given: str | None) -> tuple[Path | None, str]:
    """srt's package folder, or None and why not."""
    if shutil.which("node") is None:
        return None, "node is not installed"
    places = [Path(given)] if given else [Path("/tmp/srt"), ROOT]
    for place in places:
        for package in (place / SRT_PACKAGE, place):
            if (package / "dist" / "sandbox" / "http-proxy.js").exists():
                return package, ""
    where = " or ".join(str(place) for place in places)
    return None, (
        f"@anthropic-ai/sandbox-runtime is not installed in {where}; "
        "run `npm install @anthropic-ai/sandbox-runtime` in a folder and pass it with --srt"
    )


def run(srt_dir: str | None, rounds: int, n: int) -> None:
    processes: list[subprocess.Popen[str]] = []
    try:
        origin_process, origin = start([sys.executable, "-m", "bench.egress", "--origin"], "origin")
        processes.append(origin_process)
        egress_process, boxd = start([sys.executable, "-m", "bench.egress", "--egress"], "egress")
        processes.append(egress_process)
        least_process, least = start([sys.executable, "-m", "bench.egress", "--least"], LEAST)
        processes.append(least_process)
        package, why_not = find_srt(srt_dir)
        srt: int | None = None
        if package is not None:
            srt_process, srt = start(
                ["node", str(ROOT / "bench" / "srt_proxy.mjs"), str(package), NAME], "srt's proxy"
            )
            processes.append(srt_process)
            version = json.loads((package / "package.json").read_text())["version"]
            say(f"srt: @anthropic-ai/sandbox-runtime {version}, node {node_version()}")
        else:
            say(f"srt: not measured, {why_not}")
        say(
            f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
        )
        routes = ways(origin, boxd, least, srt)
        for name, way in routes.items():
            if fetch(way, "/small", origin) != 2:
                sys.exit(f"{name}: GET /small did not answer ok")
        speed = downloads(routes, origin, rounds)
        proxies = {"boxd": ("127.0.0.1", boxd)}
        if srt is not None:
            proxies["srt"] = ("127.0.0.1", srt)
        goals(speed, setups(routes, proxies, origin, n))
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def node_version() -> str:
    done = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=30)
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--srt", metavar="DIR", help="where @anthropic-ai/sandbox-runtime is")
    parser.add_argument("--downloads", type=int, default=DOWNLOADS)
    parser.add_argument("--setups", type=int, default=SETUPS)
    parser.add_argument("--origin", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--egress", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--least", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.origin:
        serve_origin()
    elif arguments.egress:
        asyncio.run(serve_egress())
    elif arguments.least:
        serve_least_tunnel()
    else:
        run(arguments.srt, arguments.downloads, arguments.setups)


if __name__ == "__main__":
    main()
