"""How long the checks of `boxd doctor` take: in the manager (D-Bus `CheckMachine`, which runs
them anew, as a task's start right after boxd's start waits for them) and from the command line
(`boxd doctor`, Python's start included).

Run as root from the repository: `python -m bench.doctor`. It boots a test machine, installs
this checkout, and times each many times (CheckMachine MIN_INTERVAL_SECONDS apart, so that each
call is a run, then back to back, answered the last run's findings); prints p50 and p90.
"""

import subprocess
import time

from bench.in_machine import runs_main
from boxd.wire.doctor import MIN_INTERVAL_SECONDS

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


def timed(argv: list[str], runs: int, apart: float) -> list[float]:
    seconds = []
    for _ in range(runs):
        time.sleep(apart)
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=False)
        seconds.append(time.perf_counter() - started)
    return seconds


def measure(runs: int) -> None:
    for name, argv, apart in (
        # The manager runs the checks at most once in MIN_INTERVAL_SECONDS, answering the last
        # run's findings again within them: asked further apart, each call is a run.
        ("CheckMachine (the manager)", CHECK_MACHINE, MIN_INTERVAL_SECONDS),
        ("CheckMachine within the interval (the last run's answer)", CHECK_MACHINE, 0.0),
        ("boxd doctor", [BOXD, "doctor"], 0.0),
    ):
        seconds = timed(argv, runs, apart)
        print(
            f"{name}: p50 {percentile(seconds, 0.5):.2f} s, p90 {percentile(seconds, 0.9):.2f} s, "
            f"max {max(seconds):.2f} s ({runs} runs)"
        )


def main() -> None:
    runs_main(__file__, __doc__, RUNS, measure, timeout=1800)


if __name__ == "__main__":
    main()
