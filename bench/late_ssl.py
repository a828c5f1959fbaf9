"""What asyncio imported without ssl (boxd/patches/asyncio.py) saves each kind of boxd process.

Run from the repository: `python -m bench.late_ssl` (`--runs`). For each process it imports what
that process imports at its start, in a fresh interpreter of this Python, and reads the process's
private memory (Private_Clean + Private_Dirty of /proc/self/smaps_rollup) and its Private_Dirty
alone (the heap each process pays alone; Private_Clean moves with what other processes on the
machine map). Each is measured twice, in turn: with ssl held back as a task's entry points do
(boxd/main.py's broker, the workers and the MCP relay as programs), and without, as asyncio
imports it. Printed: the median of `--runs` of each, the saving, and whether ssl was loaded.

The processes: a task's broker (`boxd broker`), its worker (`python -m boxd.workers.ahead`, told
to be the fake worker), the MCP relay Droid starts (`python -m boxd.workers.mcp.relay`), and, for
the decision to leave them as asyncio has them, the root manager (`boxd manager`) and the web
gateway (`boxd web`). Bytecode is compiled on a warm-up run, as an installed wheel has it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.broker_import import PRIVATE_KIB

RUNS = 15
HERE = Path(__file__).resolve().parent.parent

# What each process imports before it serves anything.
PROCESSES = {
    "broker": "import boxd.broker.main",
    "worker": "import boxd.workers.ahead, boxd.workers.fake",
    "relay": "import boxd.workers.mcp.relay",
    "manager": "import boxd.manager.main",
    "web": "import boxd.web.main",
}

# What a task's entry points do first.
HELD = "from boxd.patches.asyncio import import_asyncio_without_ssl\nimport_asyncio_without_ssl()\n"

_MEASURE = (
    PRIVATE_KIB
    + """
import json, sys
print(json.dumps({
    "private_kib": private_kib(),
    "dirty_kib": private_kib(("Private_Dirty:",)),
    "ssl": "ssl" in sys.modules,
}))
"""
)


def measure(code: str) -> dict[str, float]:
    environment = {**os.environ}
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    done = subprocess.run(
        [sys.executable, "-I", "-c", code + "\n" + _MEASURE],
        capture_output=True,
        text=True,
        check=True,
        env=environment,
        cwd=HERE,
    )
    answer: dict[str, float] = json.loads(done.stdout)
    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    arguments = parser.parse_args()
    print(f"median of {arguments.runs} fresh processes each, taken in turn ({sys.executable})")
    print(f"{'process':8}  {'private MiB':>24}  {'private dirty MiB':>24}  ssl loaded")
    print(f"{'':8}  {'held / as is / saved':>24}  {'held / as is / saved':>24}  (held)")
    for name, imports in PROCESSES.items():
        measure(HELD + imports)  # the warm-up: bytecode written
        runs: dict[str, list[dict[str, float]]] = {"with": [], "without": []}
        for _ in range(arguments.runs):
            runs["with"].append(measure(HELD + imports))
            runs["without"].append(measure(imports))
        figures = []
        for kind in ("private_kib", "dirty_kib"):
            patched = statistics.median(run[kind] for run in runs["with"]) / 1024
            plain = statistics.median(run[kind] for run in runs["without"]) / 1024
            figures.append(f"{patched:6.1f} / {plain:5.1f} / {plain - patched:4.2f}")
        loaded = "yes" if any(run["ssl"] for run in runs["with"]) else "no"
        print(f"{name:8}  {figures[0]:>24}  {figures[1]:>24}  {loaded}")


if __name__ == "__main__":
    main()
