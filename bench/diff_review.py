"""How long the review of a task's changes (boxd/manager/workspaces/diffs.py) takes to make, at its
caps: the manager makes it in a thread, so this is how long one review holds a thread and a CPU.

Run from the repository, no root needed: `python -m bench.diff_review`. On temp folders standing
for a task's layer over a base, it times one whole review (every page) of:

- 1,000 small text files, each changed by one line (the file cap);
- one pair of 1 MiB text files (the read cap) of short lines that all differ;
- one pair of 1 MiB text files of lines drawn from a few hundred, shuffled: diff's hard case
  (difflib took 28 s on it, GNU diff 3 s: why diffs.py runs GNU diff);
- one pair of 1 MiB files that differ in one line in the middle.

Printed: the seconds of each, best of three, and the JSON size of the answer.
"""

import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from boxd.manager.workspaces.diffs import diff_page
from boxd.reading.strict_json import size
from boxd.wire.models.task_diff import MAX_DIFF_FILES, MAX_DIFF_READ


def _review(layer: Path, base: Path) -> int:
    page, total = "", 0
    while True:
        answer = diff_page(layer, [base], page, False)
        total += sum(size(item) for item in answer.files)
        if answer.next is None:
            return total
        page = answer.next


def _lines(make: Callable[[int], str]) -> str:
    out: list[str] = []
    used, number = 0, 0
    while True:
        line = make(number) + "\n"
        if used + len(line) > MAX_DIFF_READ:
            return "".join(out)
        out.append(line)
        used += len(line)
        number += 1


def _case(name: str, fill: Callable[[Path, Path], None]) -> None:
    with tempfile.TemporaryDirectory() as top:
        layer, base = Path(top, "layer"), Path(top, "base")
        layer.mkdir()
        base.mkdir()
        fill(layer, base)
        best, shown = float("inf"), 0
        for _ in range(3):
            began = time.perf_counter()
            shown = _review(layer, base)
            best = min(best, time.perf_counter() - began)
        print(f"{name:<48} {best:7.3f} s   answer {shown / 1024:9.0f} KiB")


def _many(layer: Path, base: Path) -> None:
    for number in range(MAX_DIFF_FILES):
        text = "".join(f"line {n}\n" for n in range(40))
        (base / f"f{number:04}.txt").write_text(text)
        (layer / f"f{number:04}.txt").write_text(text.replace("line 20\n", "changed\n"))


def _all_differ(layer: Path, base: Path) -> None:
    (base / "a.txt").write_text(_lines(lambda n: f"old {n}"))
    (layer / "a.txt").write_text(_lines(lambda n: f"new {n}"))


def _repeated(layer: Path, base: Path) -> None:
    chance = random.Random(1)
    (base / "a.txt").write_text(_lines(lambda n: f"word {chance.randrange(300)}"))
    (layer / "a.txt").write_text(_lines(lambda n: f"word {chance.randrange(300)}"))


def _one_line(layer: Path, base: Path) -> None:
    text = _lines(lambda n: f"line {n}")
    (base / "a.txt").write_text(text)
    middle = len(text) // 2
    (layer / "a.txt").write_text(text[:middle] + "X" + text[middle + 1 :])


def main() -> None:
    _case(f"{MAX_DIFF_FILES:,} files, one line changed in each", _many)
    _case("1 MiB vs 1 MiB, every line different", _all_differ)
    _case("1 MiB vs 1 MiB, a few hundred lines shuffled", _repeated)
    _case("1 MiB vs 1 MiB, one line changed", _one_line)


if __name__ == "__main__":
    main()
