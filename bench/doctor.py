"""How long the checks of `boxd doctor` take: in the manager (D-Bus `CheckMachine`, which runs
them anew, as a task's start right after boxd's start waits for them) and from the command line
(`boxd doctor`, Python's start included).

Run as root from the repository: `python -m bench.doctor`. It boots a test machine, installs
this checkout, and times each many times; prints p50 and p90.
"""

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

RUNS = 20
BOXD = "/usr/lib/boxd/venv/bin/boxd"
CHECK_MACHINE = [
    "busctl",
    "call",
    "org.boxd.Box1",
    "/org/boxd/Box1",
    "org.boxd.Box1.Manager",
    "CheckMachine",
]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def timed(argv: list[str], runs: int) -> list[float]:
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=False)
        seconds.append(time.perf_counter() - started)
    return seconds


def measure(runs: int) -> None:
    for name, argv in (
        ("CheckMachine (the manager)", CHECK_MACHINE),
        ("boxd doctor", [BOXD, "doctor"]),
    ):
        seconds = timed(argv, runs)
        print(
            f"{name}: p50 {percentile(seconds, 0.5):.2f} s, p90 {percentile(seconds, 0.9):.2f} s, "
            f"max {max(seconds):.2f} s ({runs} runs)"
        )


def run_in_machine(runs: int) -> None:
    from testbed.machine import Machine, install_boxd

    with Machine() as machine:
        install_boxd(machine)
        shutil.copy(__file__, machine.root / "tmp" / "doctor_bench.py")
        done = machine.run(
            "/usr/lib/boxd/venv/bin/python",
            "/tmp/doctor_bench.py",
            "--inside",
            "--runs",
            str(runs),
            timeout=900,
        )
        print(done.stdout, end="")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--inside", action="store_true", help="measure here, in a test machine")
    parser.add_argument("--runs", type=int, default=RUNS)
    arguments = parser.parse_args()
    if arguments.inside:
        measure(arguments.runs)
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        run_in_machine(arguments.runs)


if __name__ == "__main__":
    main()
