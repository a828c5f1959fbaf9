"""How long listing a folder of the workspace as it stands takes (stack_view.list_folder, which
the manager runs in a thread), against os.scandir of the same folder: issue 34's floor is 2x.

Run from the repository: `python -m bench.workspace_view`. On temp folders standing for a
workspace's base and three done layers, it makes one folder of 10,000 files (`--files`): 4,000 in
the base, 2,000 new in each layer, and each layer also rewriting 100 of the files below it, so the
merge has names to drop. Then, best of `--runs`:

- `list_folder`: the merged listing, with each entry's kind, size, time and layer;
- `scandir + lstat` of a plain folder holding the same 10,000 files: the least a listing with
  sizes and times costs (what a file manager does in a view);
- `scandir` of it, names and kinds only (the issue's floor as it says it);
- as root, where overlayfs mounts, both again in a read-only overlay of the same stack: the view
  itself, as a task or the owner's file manager would read it.

Printed: milliseconds of each and list_folder's ratio to each floor.
"""

import argparse
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from boxd.manager.workspaces.stack_view import Level, Stack, list_folder

LAYERS = 3


def _fill(top: Path, files: int) -> tuple[Stack, list[Path]]:
    base = top / "base"
    layers = [top / str(number) for number in range(1, LAYERS + 1)]
    in_base = files - files * LAYERS // 5
    per_layer = (files - in_base) // LAYERS
    (base / "work").mkdir(parents=True)
    for number in range(in_base):
        (base / "work" / f"base-{number:05}.txt").write_bytes(b"x" * (number % 512))
    for index, layer in enumerate(layers):
        (layer / "work").mkdir(parents=True)
        for number in range(per_layer):
            (layer / "work" / f"layer{index}-{number:05}.txt").write_bytes(b"y" * 64)
        for number in range(100):  # files below, rewritten: the merge drops the older copy
            (layer / "work" / f"base-{index * 100 + number:05}.txt").write_bytes(b"z")
    levels = [Level(layer.name, layer) for layer in reversed(layers)]
    return Stack([*levels, Level(None, base)]), [*reversed(layers), base]


def _merged(top: Path, roots: list[Path]) -> Path:
    """A plain folder with the view's files: the newest copy of each."""
    plain = top / "plain"
    plain.mkdir()
    for root in reversed(roots):
        for item in os.scandir(root / "work"):
            (plain / item.name).write_bytes(Path(item.path).read_bytes())
    return plain


def _scandir(folder: Path) -> int:
    with os.scandir(folder) as names:
        return sum(1 for item in names if item.is_file(follow_symlinks=False))


def _scandir_lstat(folder: Path) -> int:
    with os.scandir(folder) as names:
        return sum(item.stat(follow_symlinks=False).st_size >= 0 for item in names)


def _best(runs: int, work: Callable[[], int]) -> tuple[float, int]:
    best, count = float("inf"), 0
    for _ in range(runs):
        began = time.perf_counter()
        count = work()
        best = min(best, time.perf_counter() - began)
    return best, count


def _overlay(top: Path, roots: list[Path]) -> Path | None:
    if os.geteuid() != 0:
        return None
    view = top / "view"
    view.mkdir()
    lower = ":".join(str(root) for root in roots)
    mounted = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", f"ro,lowerdir={lower}", str(view)],
        capture_output=True,
    )
    return view / "work" if mounted.returncode == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        top = Path(name)
        stack, roots = _fill(top, args.files)
        plain = _merged(top, roots)
        ours, listed = _best(args.runs, lambda: len(list_folder(stack, "work").entries))
        print(f"list_folder over base + {LAYERS} layers: {ours * 1000:8.2f} ms ({listed} entries)")
        floors = {
            "scandir + lstat, plain folder": _best(args.runs, lambda: _scandir_lstat(plain)),
            "scandir, plain folder": _best(args.runs, lambda: _scandir(plain)),
        }
        view = _overlay(top, roots)
        try:
            if view is not None:
                floors["scandir + lstat, overlay view"] = _best(
                    args.runs, lambda: _scandir_lstat(view)
                )
                floors["scandir, overlay view"] = _best(args.runs, lambda: _scandir(view))
            else:
                print("(no overlay view: it needs root and a filesystem overlayfs mounts on)")
            for floor, (seconds, count) in floors.items():
                assert count == listed, f"{floor} saw {count} files, list_folder {listed}"
                ratio = ours / seconds
                verdict = "within 2x" if ratio <= 2 else "OVER 2x"
                print(f"{floor:<32} {seconds * 1000:8.2f} ms   ratio {ratio:5.2f}  {verdict}")
        finally:
            if view is not None:
                subprocess.run(["umount", str(view.parent)], check=False)


if __name__ == "__main__":
    main()
