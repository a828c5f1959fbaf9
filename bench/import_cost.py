"""What importing a module costs a process that has imported asyncio already: its time and the
private memory it adds (Private_Clean + Private_Dirty of /proc/self/smaps_rollup).

Run from the repository: `python -m bench.import_cost sqlite3 importlib.metadata` (`--runs`).
Each figure is the median of `--runs` fresh interpreters of this Python (-I), after a warm-up run
that compiles the bytecode.
"""

import argparse
import json
import statistics
import subprocess
import sys

RUNS = 15

_CODE = """
import json, time

def private_kib():
    total = 0
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total

import asyncio
before = private_kib()
start = time.perf_counter()
import {module}
print(json.dumps([(time.perf_counter() - start) * 1000, (private_kib() - before) / 1024]))
"""


def measure(module: str) -> tuple[float, float]:
    done = subprocess.run(
        [sys.executable, "-I", "-c", _CODE.format(module=module)],
        capture_output=True,
        text=True,
        check=True,
    )
    milliseconds, mebibytes = json.loads(done.stdout)
    return float(milliseconds), float(mebibytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="+")
    parser.add_argument("--runs", type=int, default=RUNS)
    arguments = parser.parse_args()
    print(f"median of {arguments.runs} fresh processes each, private memory ({sys.executable})")
    for module in arguments.modules:
        measure(module)
        runs = [measure(module) for _ in range(arguments.runs)]
        milliseconds = statistics.median(run[0] for run in runs)
        mebibytes = statistics.median(run[1] for run in runs)
        print(
            f"  import {module} after asyncio: {milliseconds:.1f} ms, {mebibytes:.2f} MiB private"
        )


if __name__ == "__main__":
    main()
