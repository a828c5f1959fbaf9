"""What importing the broker costs, and what it leaves to its first requests.

Run from the repository: `python -m bench.broker_import` (`--runs`; `--against DIR` measures
another checkout, such as a worktree of main, in turn with this one, for a before and after in
one run). Each figure is the median of `--runs` fresh processes of this Python, taken in turn
with a process that imports asyncio only (the floor every broker pays, whatever it is made of):

- `import boxd.broker.main`: its wall time from an interpreter that has imported nothing of
  its own, and the process's private memory after it (Private_Clean + Private_Dirty of
  /proc/self/smaps_rollup), against the same after `import asyncio`. Private_Clean moves with
  what other processes on the machine map (a file's pages mapped by two are shared), so
  Private_Dirty, the heap each broker pays alone, is shown too;
- the first use of what a task's first requests need, in the process that just imported the
  broker, against a second use: the validation of the body of `POST /step` (and its dump, as
  the broker sends it to the manager), of `POST /ask` and `POST /call`, and, in a tree whose
  broker runs apps, the first lookup of a tool (which loads the installed apps; a broker now
  leaves it to the app's runner). `GET /task` validates nothing: its first cost is
  the D-Bus call and the JSON, which the import does not change.

The start path of a task is the import, then its worker's `GET /task` and `POST /step`: the
figure "start path" adds the import and the first `POST /step`'s validation.

The processes run as the broker's unit runs them: with its `Environment=` settings
(units/box-broker@.service) and with compiled bytecode (an installed wheel has it; an editable
checkout writes it on the warm-up run, whatever PYTHONDONTWRITEBYTECODE says).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

RUNS = 15
HERE = Path(__file__).resolve().parent.parent
UNIT = Path("units") / "box-broker@.service"

# A program's private memory, read by the program measured (bench.late_ssl reads it too).
PRIVATE_KIB = """
def private_kib(kinds=("Private_Clean:", "Private_Dirty:")):
    total = 0
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith(kinds):
                total += int(line.split()[1])
    return total
"""

_BROKER = (
    PRIVATE_KIB
    + """
import json, sys, time
start = time.perf_counter()
try:
    # As the broker's console script does: asyncio without ssl, then the broker.
    from boxd.patches.asyncio import import_asyncio_without_ssl
    import_asyncio_without_ssl()
except ImportError:
    pass  # A checkout from before boxd/patches/, whose `import boxd` held ssl back itself.
import boxd.broker.main
imported = time.perf_counter()
memory = private_kib()
dirty = private_kib(("Private_Dirty:",))

from boxd.broker.calls import CallRequest
try:
    from boxd.wire.approval import AskRequest
    from boxd.wire.step import Step
except ImportError:
    # A checkout from before boxd's shared modules had folders (--against one).
    from boxd.approval import AskRequest
    from boxd.step import Step
try:
    from boxd.apps.registry import find_tool
except ImportError:
    # A broker that looks up no tool: its app's runner does (boxd/apps/runner.py).
    find_tool = None

STEP = b'{"text": "read the files", "data": {"n": 1}}'
ASK = b'{"question": "May I?", "key": "k1", "costCents": 5}'
CALL = b'{"tool": "echo.say", "input": {"text": "hi"}, "key": "k"}'
if hasattr(Step, "read"):
    # Read by boxd.reading.json_reader, as the broker reads them now.
    step = lambda: Step.read(STEP).json()
    ask = lambda: AskRequest.read(ASK)
    call = lambda: CallRequest.read(CALL)
else:
    # A tree whose broker reads them with pydantic models (--against an older checkout).
    from boxd.plain_errors import parse
    step = lambda: parse(Step, STEP).model_dump(mode="json")
    ask = lambda: parse(AskRequest, ASK)
    call = lambda: parse(CallRequest, CALL)

def twice(use):
    times = []
    for _ in range(2):
        began = time.perf_counter()
        use()
        times.append((time.perf_counter() - began) * 1000)
    return times

first = {
    "POST /step": twice(step),
    "POST /ask": twice(ask),
    "POST /call": twice(call),
}
# Whether the start path (the import, the first step, ask and call) loaded pydantic; a tool's
# input model loads it with the tool.
pydantic = "pydantic" in sys.modules
if find_tool is not None:
    first["a tool's lookup"] = twice(lambda: find_tool("echo.say"))
print(json.dumps({
    "import_ms": (imported - start) * 1000,
    "private_kib": memory,
    "dirty_kib": dirty,
    "first": first,
    "pydantic": pydantic,
}))
"""
)

_FLOOR = (
    PRIVATE_KIB
    + """
import json
import asyncio
print(json.dumps({"private_kib": private_kib(), "dirty_kib": private_kib(("Private_Dirty:",))}))
"""
)


def unit_environment(tree: Path) -> dict[str, str]:
    """The broker unit's `Environment=` settings in `tree`, but BOX_HOME: imports do not read
    it."""
    settings = {}
    for line in (tree / UNIT).read_text().splitlines():
        name, is_set, value = line.removeprefix("Environment=").partition("=")
        if line.startswith("Environment=") and is_set and name != "BOX_HOME":
            settings[name] = value
    return settings


class Tree:
    """A checkout whose broker is measured: this one, or another by --against."""

    def __init__(self, root: Path, own: bool) -> None:
        self.root = root
        self.settings = unit_environment(root)
        self.environment = {**os.environ, **self.settings}
        # Bytecode is written on the warm-up run and read after, as an installed wheel's is.
        self.environment.pop("PYTHONDONTWRITEBYTECODE", None)
        if not own:
            # Found before the editable install of this checkout.
            self.environment["PYTHONPATH"] = str(root)
        self.brokers: list[dict[str, Any]] = []
        self.floors: list[dict[str, Any]] = []

    def run(self, code: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env=self.environment,
            cwd=self.root,
        )
        answer: dict[str, Any] = json.loads(done.stdout)
        return answer

    def measure(self) -> None:
        self.brokers.append(self.run(_BROKER))
        self.floors.append(self.run(_FLOOR))

    def show(self) -> None:
        brokers, floors = self.brokers, self.floors
        shown = " ".join(f"{name}={value}" for name, value in self.settings.items()) or "none"
        print(f"{self.root} (the broker unit's environment: {shown})")
        import_ms = median([run["import_ms"] for run in brokers])
        print(f"  import boxd.broker.main: {import_ms:.1f} ms")
        for kind, label in (("private_kib", "private"), ("dirty_kib", "private dirty")):
            broker = median([run[kind] / 1024 for run in brokers])
            floor = median([run[kind] / 1024 for run in floors])
            print(
                f"  {label} memory after it: {broker:.1f} MiB; after import asyncio only: "
                f"{floor:.1f} MiB; the broker's own: {broker - floor:.1f} MiB"
            )
        print("  first use / second use, in the process that imported the broker:")
        for kind in brokers[0]["first"]:
            first = median([run["first"][kind][0] for run in brokers])
            second = median([run["first"][kind][1] for run in brokers])
            print(f"    {kind}: {first:.2f} ms / {second:.3f} ms")
        loaded = "yes" if any(run["pydantic"] for run in brokers) else "no"
        print(f"  pydantic imported by the import and the first step, ask and call: {loaded}")
        step = median([run["import_ms"] + run["first"]["POST /step"][0] for run in brokers])
        print(f"  start path (import + the first POST /step's validation): {step:.1f} ms")


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument(
        "--against",
        type=Path,
        help="another checkout (e.g. `git worktree add` of main) measured in turn with this one",
    )
    arguments = parser.parse_args()
    trees = [Tree(HERE, own=True)]
    if arguments.against is not None:
        trees.insert(0, Tree(arguments.against.resolve(), own=False))
    for tree in trees:
        tree.run(_BROKER)
    for _ in range(arguments.runs):
        for tree in trees:
            tree.measure()
    print(f"median of {arguments.runs} fresh processes each, taken in turn ({sys.executable})")
    for tree in trees:
        tree.show()


if __name__ == "__main__":
    main()
