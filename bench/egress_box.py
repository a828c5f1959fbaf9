"""What a task's egress costs on the real path: from inside a task's network namespace, through
the socket systemd binds there, to the task's broker, out to a server; next to the same download
made directly from the machine's main namespace.

Run as root from the repository: `.venv/bin/python -m bench.egress_box`. It boots a test
machine, installs this checkout, makes the simulated outside world of tests/vm (a network
namespace behind a veth pair, names in /etc/hosts) and, in it, a server that answers `GET /big`
with 100 MB and `GET /small` with two bytes. One fake task (`sleep 600`, hosts `allowed.test`)
holds its namespace open. Then, round by round, so drift touches every way alike:

- a 100 MB download: directly from the main namespace, and from inside the task's namespace
  through its HTTP proxy (plain HTTP, and a CONNECT tunnel), median of DOWNLOADS each;
- connection set-up, p50 and p90 of SETUPS tries: a TCP connect directly, and connect + CONNECT
  + the proxy's 200 through the task's proxy (the broker resolves the name, checks it against
  the task's hosts and dials).

The client is the same small Python program on both sides (blocking sockets, one connection at a
time); inside the namespace it runs as root with `ip netns exec`, the same sockets the task's
own user would reach. bench/egress.py measures the proxy alone on the host, next to Anthropic's
sandbox runtime.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

DOWNLOADS = 5
SETUPS = 300
PORT = 9000
BIG = 100 * 1000 * 1000

ORIGIN = f"""
import socketserver
BIG, CHUNK = {BIG}, 1 << 20

class Origin(socketserver.StreamRequestHandler):
    def handle(self):
        line = self.rfile.readline()
        while self.rfile.readline() not in (b"\\r\\n", b"\\n", b""):
            pass
        size = BIG if b"/big HTTP" in line else 2
        answer = b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\nConnection: close\\r\\n\\r\\n"
        self.wfile.write(answer % size)
        block = b"x" * CHUNK
        left = size
        while left:
            piece = block[: min(left, CHUNK)]
            self.wfile.write(piece)
            left -= len(piece)

class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    # Set-up is measured one connection after another: a backlog of 5 overflows, and a dropped
    # SYN costs a second.
    request_queue_size = 1024

Server(("0.0.0.0", {PORT}), Origin).serve_forever()
"""

CLIENT = """
import json, socket, sys, time

def head(sock):
    data = b""
    while b"\\r\\n\\r\\n" not in data:
        more = sock.recv(65536)
        if not more:
            raise SystemExit("the connection closed before a whole answer head")
        data += more
    top, _, rest = data.partition(b"\\r\\n\\r\\n")
    if b" 200 " not in top.split(b"\\r\\n")[0] + b" ":
        raise SystemExit(top.decode(errors="replace"))
    return rest

def tunnel(proxy, host, port):
    sock = socket.create_connection(proxy)
    sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n".encode())
    head(sock)
    return sock

def download(way, host, port, proxy):
    began = time.perf_counter()
    if way == "direct":
        sock, target = socket.create_connection((host, port)), "/big"
    elif way == "connect":
        sock, target = tunnel(proxy, host, port), "/big"
    else:
        sock, target = socket.create_connection(proxy), f"http://{host}:{port}/big"
    sock.sendall(f"GET {target} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n".encode())
    got = len(head(sock))
    buffer = bytearray(1 << 20)
    while True:
        n = sock.recv_into(buffer)
        if not n:
            break
        got += n
    sock.close()
    if got != BIG:
        raise SystemExit(f"got {got} bytes, not {BIG}")
    return time.perf_counter() - began

def setups(way, host, port, proxy, count):
    times = []
    for _ in range(count):
        began = time.perf_counter()
        if way == "direct":
            sock = socket.create_connection((host, port))
        else:
            sock = tunnel(proxy, host, port)
        times.append((time.perf_counter() - began) * 1e6)
        sock.close()
    return times

mode, way, host, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
BIG = int(sys.argv[5])
proxy = ("127.0.0.1", 3128)
if mode == "download":
    print(json.dumps(download(way, host, port, proxy)))
else:
    print(json.dumps(setups(way, host, port, proxy, int(sys.argv[6]))))
"""


def say(line: str) -> None:
    print(line, flush=True)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--downloads", type=int, default=DOWNLOADS)
    parser.add_argument("--setups", type=int, default=SETUPS)
    arguments = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from testbed.box_api import start_fake
    from testbed.machine import Machine, install_boxd
    from testbed.outside_world import ADDRESS, NAMESPACE, start_outside

    began = time.monotonic()
    with Machine() as machine:
        install_boxd(machine)
        token = machine.run("boxctl", "token", "create", "--name", "bench").stdout.strip()
        outside = start_outside(machine)
        machine.run("tee", "/run/outside/origin.py", input=ORIGIN)
        machine.run("tee", "/run/outside/client.py", input=CLIENT)
        origin = machine.spawn(
            "ip", "netns", "exec", NAMESPACE, "python3", "/run/outside/origin.py"
        )
        try:
            task = start_fake(machine, token, "sleep 600", hosts=["allowed.test"])
            if task["state"] != "running":
                sys.exit(f"the holding task is {task['state']}: {task.get('error')}")
            inside = ["ip", "netns", "exec", f"box-{task['id']}"]
            say(f"machine ready in {time.monotonic() - began:.0f} s; task {task['id']} holds")
            time.sleep(1)

            def client(*args: str, netns: bool) -> object:
                argv = [*(inside if netns else []), "python3", "/run/outside/client.py", *args]
                return json.loads(machine.run(*argv, timeout=600).stdout)

            ways = {
                "direct, main namespace": ("direct", ADDRESS, False),
                "task's proxy, plain HTTP": ("plain", "allowed.test", True),
                "task's proxy, CONNECT": ("connect", "allowed.test", True),
            }
            times: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(arguments.downloads):
                for name, (way, host, netns) in ways.items():
                    seconds = client("download", way, host, str(PORT), str(BIG), netns=netns)
                    assert isinstance(seconds, float)
                    times[name].append(seconds)
            say(f"\n100 MB download, median of {arguments.downloads}")
            direct = statistics.median(times["direct, main namespace"])
            for name, values in times.items():
                median = statistics.median(values)
                say(
                    f"  {name:<26} {median * 1000:7.0f} ms  {BIG / median / 1e6:7.0f} MB/s  "
                    f"speed {direct / median:.2f} of direct"
                )
            setup: dict[str, list[float]] = {"direct TCP connect": [], "CONNECT through": []}
            rounds = 10
            for _ in range(rounds):
                count = str(arguments.setups // rounds)
                found = client("setup", "direct", ADDRESS, str(PORT), "0", count, netns=False)
                assert isinstance(found, list)
                setup["direct TCP connect"].extend(found)
                found = client(
                    "setup", "connect", "allowed.test", str(PORT), "0", count, netns=True
                )
                assert isinstance(found, list)
                setup["CONNECT through"].extend(found)
            say(f"\nconnection set-up, {len(setup['direct TCP connect'])} tries each, µs")
            floor = percentile(setup["direct TCP connect"], 0.5)
            for name, values in setup.items():
                p50 = percentile(values, 0.5)
                say(
                    f"  {name:<26} p50 {p50:7.0f}  p90 {percentile(values, 0.9):7.0f}  "
                    f"ratio {p50 / floor:.1f}"
                )
        finally:
            origin.kill()
            outside.kill()
    say(f"\nall told: {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
