"""How fast an owner's upload is written (tar_upload.add_tar, which the manager runs in a thread,
then the fsyncs that make a recorded layer whole), against GNU tar extracting the same stream and
`sync -f`: the least unpacking the same bytes onto the same disk costs. Floor: 0.5x tar's speed.

Run from the repository: `python -m bench.owner_upload [--mib 512] [--files 1] [--runs 3]
[--dir /var/tmp]`. The archive is made once, in `--dir` (on the disk whose speed is measured),
with `--files` files of `--mib` MiB in all; each run reads it from a file descriptor, as the
manager reads the pipe boxctl or the web process writes. Printed: seconds and MiB/s of each, best
of the runs, and the ratio.
"""

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from boxd.manager.workspaces.diffs import Marks
from boxd.manager.workspaces.owner_layer import stage, synced, throw_away
from boxd.manager.workspaces.stack_view import Level, Stack
from boxd.manager.workspaces.tar_upload import add_tar

FLOOR = 0.5


def _tar(root: Path, archive: Path) -> float:
    out = root / "by-tar"
    out.mkdir()
    started = time.perf_counter()
    subprocess.run(["tar", "xf", str(archive), "-C", str(out)], check=True)
    subprocess.run(["sync", "-f", str(out)], check=True)
    took = time.perf_counter() - started
    shutil.rmtree(out)
    return took


def _ours(root: Path, archive: Path, stack: Stack) -> float:
    made = stage(root / "store", -1)
    fd = os.open(archive, os.O_RDONLY)
    try:
        started = time.perf_counter()
        add_tar(made, stack, "", fd)
        synced(made)
        return time.perf_counter() - started
    finally:
        os.close(fd)
        throw_away(made)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--files", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default="/var/tmp")
    arguments = parser.parse_args()
    root = Path(tempfile.mkdtemp(dir=arguments.dir, prefix="bench-owner-upload-"))
    try:
        source, base = root / "source", root / "base"
        source.mkdir()
        base.mkdir()
        each = (arguments.mib << 20) // arguments.files
        block = os.urandom(1 << 20)
        for number in range(arguments.files):
            with open(source / f"f{number:05}.bin", "wb") as out:
                for _ in range(each >> 20):
                    out.write(block)
                out.write(block[: each % (1 << 20)])
        archive = root / "upload.tar"
        subprocess.run(["tar", "cf", str(archive), "-C", str(source), "."], check=True)
        shutil.rmtree(source)
        stack = Stack([Level(None, base)], Marks())
        tar = min(_tar(root, archive) for _ in range(arguments.runs))
        ours = min(_ours(root, archive, stack) for _ in range(arguments.runs))
        mib = arguments.mib
        print(f"{mib} MiB in {arguments.files} file(s), best of {arguments.runs}:")
        print(f"  tar xf + sync -f      {tar:6.2f} s  {mib / tar:7.0f} MiB/s")
        print(f"  add_tar + fsync       {ours:6.2f} s  {mib / ours:7.0f} MiB/s")
        ratio = tar / ours
        verdict = "ok" if ratio >= FLOOR else "BELOW THE FLOOR"
        print(f"  speed against tar     {ratio:6.2f}x  (floor {FLOOR}x): {verdict}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
