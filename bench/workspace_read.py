"""How fast a workspace's file is read over HTTP (GET /api/workspaces/{name}/files/{path}: the
manager opens it from the stack and passes its descriptor, the web process streams it), against
`cat FILE > /dev/null` of the same file: issue 34's floor is 0.8x cat's throughput.

Run as root from the repository: `python -m bench.workspace_read`. It boots a test machine,
installs this checkout and, inside it, writes a file of `--mib` MiB (1 GiB) of random bytes in a
new workspace's base, reads it once to have it in the page cache, then, best of `--runs`: curl
of the route to /dev/null (`-o /dev/null`, the bytes checked by their count), and cat of the
file. Printed: MB/s of each and the route's share of cat's.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

API = "http://127.0.0.1:7700"
WORKSPACE = "readbench"
BASE = f"/var/lib/box/workspaces/{WORKSPACE}"
FLOOR = 0.8


def _best(runs: int, argv: list[str]) -> tuple[float, str]:
    best, out = float("inf"), ""
    for _ in range(runs):
        began = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        best = min(best, time.perf_counter() - began)
        out = done.stdout
    return best, out


def measure(token: str, mib: int, runs: int) -> int:
    subprocess.run(
        [
            "curl",
            "-sS",
            "-o",
            "/dev/null",
            "-H",
            f"Authorization: Bearer {token}",
            "-H",
            "Content-Type: application/json",
            "--data",
            json.dumps({"name": WORKSPACE}),
            f"{API}/api/workspaces",
        ],
        check=True,
    )
    path = f"{BASE}/big.bin"
    subprocess.run(
        ["sh", "-c", f"head -c {mib}M /dev/urandom > {path} && cat {path} > /dev/null"], check=True
    )
    size = Path(path).stat().st_size
    curl = [
        "curl",
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{size_download} %{http_code}",
        "-H",
        f"Authorization: Bearer {token}",
        f"{API}/api/workspaces/{WORKSPACE}/files/big.bin",
    ]
    _best(1, curl)  # the web process started, its first import done
    served, got = _best(runs, curl)
    if got.split() != [str(size), "200"]:
        sys.exit(f"the route answered {got!r}, not the file's {size} bytes")
    cat, _ = _best(runs, ["sh", "-c", f"cat {path} > /dev/null"])
    rate = size / 1e6
    share = cat / served
    print(f"{size / (1 << 20):.0f} MiB, best of {runs}")
    print(f"GET .../files/big.bin (curl)  {served:7.3f} s  {rate / served:8.0f} MB/s")
    print(f"cat FILE > /dev/null          {cat:7.3f} s  {rate / cat:8.0f} MB/s")
    verdict = "at or above" if share >= FLOOR else "BELOW"
    print(f"the route reads at {share:.2f}x cat's throughput: {verdict} the {FLOOR}x floor")
    return 0 if share >= FLOOR else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--inside", metavar="TOKEN", help="measure here, in a test machine")
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=5)
    arguments = parser.parse_args()
    if arguments.inside:
        sys.exit(measure(arguments.inside, arguments.mib, arguments.runs))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.in_machine import run_in_machine

    extra = ["--mib", str(arguments.mib), "--runs", str(arguments.runs)]
    sys.exit(run_in_machine(__file__, extra, timeout=1800))


if __name__ == "__main__":
    main()
