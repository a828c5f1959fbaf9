"""How fast a whole workspace downloads as a tar over HTTP (GET /api/workspaces/{name}/archive:
the manager walks the stack and writes the tar into a pipe from a thread, the web process streams
the pipe), against GNU tar of the same tree: issue 34's floor is 0.5x tar's throughput.

Run as root from the repository: `python -m bench.workspace_archive`. It boots a test machine,
installs this checkout and, inside it, writes `--mib` MiB (1 GiB) of random bytes in a new
workspace's base as `--files` files in 64 folders, reads them once to have them in the page
cache, then, best of `--runs`, in turn: curl of the route to /dev/null (the bytes counted), and
`tar -cf - DIR | cat > /dev/null` of the same folder (through cat, so GNU tar does not skip
reading the files as it does when it sees its archive is /dev/null). Printed: MB/s of each (of
the files' bytes) and the route's share of tar's.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

API = "http://127.0.0.1:7700"
WORKSPACE = "tarbench"
BASE = f"/var/lib/box/workspaces/{WORKSPACE}"
FLOOR = 0.5
FOLDERS = 64


def _best(runs: int, argv: list[str]) -> tuple[float, str]:
    best, out = float("inf"), ""
    for _ in range(runs):
        began = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        best = min(best, time.perf_counter() - began)
        out = done.stdout
    return best, out


def _fill(mib: int, files: int) -> int:
    """Writes the files and reads them once; their total size in bytes."""
    each = (mib << 20) // files
    for number in range(files):
        folder = Path(BASE) / f"d{number % FOLDERS}"
        folder.mkdir(exist_ok=True)
        (folder / f"f{number}.bin").write_bytes(os.urandom(each))
    subprocess.run(["sh", "-c", f"find {BASE} -type f -exec cat {{}} + > /dev/null"], check=True)
    return each * files


def measure(token: str, mib: int, files: int, runs: int) -> int:
    auth = ["-H", f"Authorization: Bearer {token}"]
    make = ["curl", "-sS", "-o", "/dev/null", *auth, "-H", "Content-Type: application/json"]
    make += ["--data", json.dumps({"name": WORKSPACE}), f"{API}/api/workspaces"]
    subprocess.run(make, check=True)
    size = _fill(mib, files)
    curl = ["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download} %{http_code}", *auth]
    curl.append(f"{API}/api/workspaces/{WORKSPACE}/archive")
    _best(1, curl)  # the web process started, its first import done
    tar = ["sh", "-c", f"tar -cf - -C {BASE} . | cat > /dev/null"]
    served, got = float("inf"), ""
    floor = float("inf")
    for _ in range(runs):  # in turn, so a moment of load falls on both alike
        once, got = _best(1, curl)
        served = min(served, once)
        floor = min(floor, _best(1, tar)[0])
    downloaded, status = got.split()
    if status != "200" or int(downloaded) < size:
        sys.exit(f"the route answered {got!r}, less than the files' {size} bytes")
    rate = size / 1e6
    share = floor / served
    print(f"{size / (1 << 20):.0f} MiB in {files} files, {FOLDERS} folders; best of {runs}")
    print(f"GET .../archive (curl)         {served:7.3f} s  {rate / served:8.0f} MB/s")
    print(f"tar -cf - DIR | cat >/dev/null {floor:7.3f} s  {rate / floor:8.0f} MB/s")
    print(f"the archive is {int(downloaded) / size:.4f}x the files' bytes")
    verdict = "at or above" if share >= FLOOR else "BELOW"
    print(f"the route archives at {share:.2f}x tar's throughput: {verdict} the {FLOOR}x floor")
    return 0 if share >= FLOOR else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--inside", metavar="TOKEN", help="measure here, in a test machine")
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--files", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=5)
    arguments = parser.parse_args()
    if arguments.inside:
        sys.exit(measure(arguments.inside, arguments.mib, arguments.files, arguments.runs))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.in_machine import run_in_machine

    extra = ["--mib", str(arguments.mib), "--files", str(arguments.files)]
    extra += ["--runs", str(arguments.runs)]
    sys.exit(run_in_machine(__file__, extra, timeout=1800))


if __name__ == "__main__":
    main()
