"""How long the box's manager (and its HTTP gateway) take to come back after `kill -9`.

Run as root from the repository: `python -m bench.restart_latency`. It boots a test machine,
installs this checkout, and inside it kills the unit's main process again and again, each time
once it is back: "back" is systemd's word that the unit is active under a new main process (for
boxd, Type=notify: once it said READY). Prints p50 and p90 per unit; RestartSec in the unit
(units/boxd.service) is part of the figure, on purpose.
"""

import os
import signal
import subprocess
import sys
import time

from bench.in_machine import runs_main

RUNS = 20
UNITS = ("boxd.service", "boxd-web.service")
POLL_SECONDS = 0.01


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def _state(unit: str) -> tuple[int, str]:
    shown = subprocess.run(
        ["systemctl", "show", "-p", "MainPID", "-p", "ActiveState", unit],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    fields = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    return int(fields["MainPID"]), fields["ActiveState"]


def kill_and_time(unit: str) -> float:
    before, state = _state(unit)
    if before == 0 or state != "active":
        sys.exit(f"{unit} is not running ({state}); cannot measure its restart")
    started = time.perf_counter()
    os.kill(before, signal.SIGKILL)
    deadline = started + 60
    while time.perf_counter() < deadline:
        pid, state = _state(unit)
        if pid not in (0, before) and state == "active":
            return time.perf_counter() - started
        time.sleep(POLL_SECONDS)
    sys.exit(f"{unit} was not back within 60 s of kill -9")


def measure(runs: int) -> None:
    # boxd-web is socket-activated: the first request starts it.
    subprocess.run(["curl", "-s", "-o", "/dev/null", "http://127.0.0.1:7700/"], check=False)
    for unit in UNITS:
        seconds = [kill_and_time(unit) for _ in range(runs)]
        print(
            f"{unit}: back after kill -9 in p50 {percentile(seconds, 0.5):.2f} s, "
            f"p90 {percentile(seconds, 0.9):.2f} s, max {max(seconds):.2f} s ({runs} kills)"
        )


def main() -> None:
    runs_main(__file__, __doc__, RUNS, measure, timeout=900)


if __name__ == "__main__":
    main()
