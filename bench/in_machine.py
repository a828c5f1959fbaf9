"""A benchmark measures inside a test machine, where boxd runs under a real systemd: the host
side boots one, installs this checkout, makes a token, copies the benchmark's own file in (and
this module beside it, as /tmp/bench/in_machine.py) and runs it there with `--inside TOKEN`,
whose output is the benchmark's."""

import argparse
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from testbed.machine import Machine

# The interpreter of boxd's own venv in the machine: the benchmark imports what boxd does.
PYTHON = "/usr/lib/boxd/venv/bin/python"


def run_script(
    machine: "Machine", script: str, token: str, args: Sequence[str], *, timeout: float
) -> "subprocess.CompletedProcess[str]":
    """Runs `script` (a benchmark's __file__) in the machine with `--inside TOKEN ARGS`. It is
    copied to /tmp readable by all: some benchmarks run parts of it as the tasks' users."""
    target = machine.root / "tmp" / Path(script).name
    shutil.copy(script, target)
    target.chmod(0o644)
    package = machine.root / "tmp" / "bench"
    package.mkdir(exist_ok=True)
    for name in ("__init__.py", "in_machine.py"):
        shutil.copy(Path(__file__).with_name(name), package / name)
        (package / name).chmod(0o644)
    return machine.run(
        PYTHON, f"/tmp/{target.name}", "--inside", token, *args, check=False, timeout=timeout
    )


def run_in_machine(script: str, args: Sequence[str], *, timeout: float) -> int:
    """Boots a machine with boxd, runs the benchmark there, passes on its output; its exit code."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from testbed.machine import Machine, install_boxd

    with Machine() as machine:
        install_boxd(machine)
        token = machine.run("boxctl", "token", "create", "--name", "bench").stdout.strip()
        done = run_script(machine, script, token, args, timeout=timeout)
        print(done.stdout, end="")
        print(done.stderr, end="", file=sys.stderr)
        return done.returncode


def runs_main(
    script: str, doc: str | None, runs: int, measure: Callable[[int], None], *, timeout: float
) -> None:
    """The command line of a benchmark whose one knob is how many runs: with `--inside`, it
    measures here; else it boots a machine to measure in."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--inside", metavar="TOKEN", help="measure here")
    parser.add_argument("--runs", type=int, default=runs)
    arguments = parser.parse_args()
    if arguments.inside:
        measure(arguments.runs)
        return
    sys.exit(run_in_machine(script, ["--runs", str(arguments.runs)], timeout=timeout))
