"""What making a joined layer readable by boxd-owner costs its join (owner_access.open_to_owner,
which the manager runs in a thread under the workspace's joins lock), against the least walk of
the same layer.

Run from the repository: `python -m bench.owner_view_join`. On a temp folder standing for a
layer, it makes `--files` files (10,000) of `--size` bytes in folders of 100, each file 0664 as
a task's worker leaves them (umask 002) or 0600 for one in ten, then, each on a fresh copy of the
layer, best of `--runs`:

- `open_to_owner`: the join's walk, by directory fds, opening each plain file O_NOFOLLOW and
  setting its ACL (the first walk of a layer: every file changes);
- `open_to_owner again`: the same on a layer that has the entries already (reads the ACLs only);
- `walk + open + fstat`: the same walk and opens without the ACLs: the floor of a walk that
  checks what it opened;
- `scandir + lstat`: a plain walk that opens nothing.

Printed: milliseconds of each, the time a file, and the ratio of the join's walk to each floor.

As root (overlayfs mounts), also a remake of the view (owner_views.py) at 1 and 499 done layers
over a base, median of 4 times `--runs`: mount the overlay on a new generation folder, swap the link
with rename(2), detach the old one; beside the floor of one `mount` and `umount` of a tmpfs, the
least two mount commands cost.
"""

import argparse
import os
import shutil
import stat
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from boxd.manager.workspaces.layers import layer_name
from boxd.manager.workspaces.owner_access import open_to_owner
from boxd.manager.workspaces.owner_views import OwnerViews, mount_options

PER_FOLDER = 100
GID = 4242


def _fill(layer: Path, files: int, size: int) -> None:
    layer.mkdir(mode=0o700)
    for number in range(files):
        folder = layer / f"d{number // PER_FOLDER:04}"
        folder.mkdir(mode=0o775, exist_ok=True)
        path = folder / f"f{number:05}.txt"
        path.write_bytes(b"x" * size)
        path.chmod(0o600 if number % 10 == 0 else 0o664)


def _walk_open(root: Path) -> None:
    for folder, _, names in os.walk(root):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for name in names:
                inner = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
                stat.S_ISREG(os.fstat(inner).st_mode)
                os.close(inner)
        finally:
            os.close(fd)


def _scan(root: Path) -> None:
    stack = [str(root)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                entry.stat(follow_symlinks=False)


def _best(runs: int, prepare: Callable[[], Path], work: Callable[[Path], object]) -> float:
    best = float("inf")
    for _ in range(runs):
        layer = prepare()
        began = time.perf_counter()
        work(layer)
        best = min(best, time.perf_counter() - began)
    return best


def _remakes(top: Path, depth: int, runs: int) -> float:
    """Median seconds of a remake of a view of `depth` done layers, as view_mounts does it."""
    home = top / f"home-{depth}"
    store = home / "layers" / "w"
    store.mkdir(parents=True)
    (home / "workspaces" / "w").mkdir(parents=True)
    (home / "workspaces" / "w" / "base.txt").write_text("base")
    stack = [layer_name(number) for number in range(depth, 0, -1)]
    for name in stack:
        (store / name).mkdir()
        (store / name / f"{name}.txt").write_text(name)
    views = OwnerViews(home, top / f"views-{depth}")
    views.root.mkdir()
    views.prepare()
    options = mount_options(stack, views.base("w"), views.root / ".empty")
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        generation = views.new_generation()
        subprocess.run(
            ["mount", "-t", "overlay", "boxd-view", "-o", options, str(generation)],
            cwd=store,
            check=True,
        )
        old = views.swap("w", generation)
        if old is not None:
            subprocess.run(["umount", "--lazy", str(old)], check=True)
            views.remove_generation(old)
        times.append(time.perf_counter() - began)
    last = views.current("w")
    assert last is not None and len(os.listdir(last)) == depth + 1
    subprocess.run(["umount", "--lazy", str(last)], check=True)
    return statistics.median(times)


def _tmpfs_floor(top: Path, runs: int) -> float:
    point = top / "floor"
    point.mkdir()
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        subprocess.run(["mount", "-t", "tmpfs", "floor", str(point)], check=True)
        subprocess.run(["umount", str(point)], check=True)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/var/tmp")) as top:
        pristine = Path(top) / "pristine"
        _fill(pristine, args.files, args.size)
        copy = Path(top) / "copy"

        def fresh() -> Path:
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(pristine, copy, symlinks=True)
            return copy

        def granted() -> Path:
            return copy

        figures = {
            "open_to_owner": _best(args.runs, fresh, lambda p: open_to_owner(p, GID)),
            "open_to_owner again": _best(args.runs, granted, lambda p: open_to_owner(p, GID)),
            "walk + open + fstat": _best(args.runs, granted, _walk_open),
            "scandir + lstat": _best(args.runs, granted, _scan),
        }
    join = figures["open_to_owner"]
    print(f"a layer of {args.files} files of {args.size} bytes, best of {args.runs}")
    for name, seconds in figures.items():
        ratio = join / seconds
        print(
            f"{name:<22} {seconds * 1000:8.1f} ms {seconds * 1e6 / args.files:6.1f} µs a file"
            f"   join's walk / this: {ratio:5.2f}x"
        )
    if os.geteuid() != 0:
        print("the view's remake: not measured (overlayfs mounts need root)")
        return
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        runs = args.runs * 4
        floor = _tmpfs_floor(Path(top), runs)
        print(f"a view's remake, median of {runs}; floor: mount + umount of a tmpfs")
        print(f"{'floor':<22} {floor * 1000:8.1f} ms")
        for depth in (1, 499):
            seconds = _remakes(Path(top), depth, runs)
            print(
                f"{f'{depth} done layers':<22} {seconds * 1000:8.1f} ms   {seconds / floor:5.2f}x"
            )


if __name__ == "__main__":
    main()
