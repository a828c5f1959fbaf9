"""What an idle task costs boxd, and what the first request after idle costs.

Run as root from the repository: `python -m bench.idle_memory` (`--tasks`, `--idle-ms`). It boots
a test machine, installs this checkout, copies bench/ in and runs this there as root, as
bench/load.py does, whose measures it shares (a unit's memory: its cgroup's memory.current where
the kernel counts memory per unit, else the PSS of the processes in its cgroup.procs, read from
/proc/<pid>/smaps_rollup: the test machines here run on a hybrid cgroup host with no per-unit
memory.current).

It prints:
- the broker's import (`python -X importtime -c "import boxd.broker.main"`, median of five) and
  the imports that take the most of it;
- for each of `--tasks` fake tasks whose worker sleeps after a first step: boxd's own memory in
  the task's units (the broker's, box-broker@<id>.service; its four socket units hold no
  process) with its broker up, just after a request, and once the task is idle (the broker
  gone after BOX_BROKER_IDLE_MS, set to `--idle-ms` for the run by a drop-in); the worker's (the
  agent's, not boxd's) beside it;
- the first request after idle, whose connection starts the broker again (GET /tools, and POST
  /step as the worker's next step), against the same request to a broker already up;
- whether each broker's unit went inactive, never failed, and was started again by its socket;
- what the spares cost while they wait for a task (boxd/manager/spares.py): each one's broker
  and worker, both started ahead and both boxd's own (the worker runs no agent until a task
  takes it), measured before any task starts.

The memory of 100 running tasks' brokers is bench/load.py's ("running, broker").
"""

import argparse
import asyncio
import json
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.in_machine import PYTHON
from bench.load import (
    BOXCTL,
    MEMORY_SOURCE,
    broker_unit,
    cgroup_bytes,
    logged,
    mib,
    run,
    start_tasks,
    stop_unended,
    unit_cgroups,
    worker_unit,
)
from boxd.manager.spares import SPARES
from boxd.manager.units.worker_ahead import catches
from boxd.wire.worker_kinds import WAKES

TASKS = 5
IDLE_MS = 3000
WARM_TRIES = 5
IMPORT_TRIES = 5
DROP_IN = Path("/etc/systemd/system/box-broker@.service.d/60-bench-idle.conf")
POLL_SECONDS = 0.05
KINDS = ("GET /tools", "POST /step")


def import_profile() -> tuple[float, list[tuple[float, str]]]:
    """Milliseconds to import the broker (the median run), and its heaviest imports."""
    runs = []
    for _ in range(IMPORT_TRIES):
        done = subprocess.run(
            [PYTHON, "-X", "importtime", "-c", "import boxd.broker.main"],
            capture_output=True,
            text=True,
            check=True,
        )
        rows = []
        for line in done.stderr.splitlines():
            found = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
            if found:
                # One space after the bar, then two for each level down.
                rows.append((int(found[2]) / 1000, (len(found[3]) - 1) // 2, found[4]))
        total = next(ms for ms, _, name in rows if name == "boxd.broker.main")
        runs.append((total, rows))
    runs.sort(key=lambda one: one[0])
    total, rows = runs[len(runs) // 2]
    # What the broker's own modules import, three levels down from it: the packages they bring.
    top = sorted(((ms, name) for ms, depth, name in rows if depth in (1, 2, 3)), reverse=True)
    return total, top[:12]


def unit_state(unit: str) -> dict[str, str]:
    shown = run(
        "systemctl",
        "show",
        "-p",
        "ActiveState",
        "-p",
        "Result",
        "-p",
        "NRestarts",
        "-p",
        "MainPID",
        unit,
    )
    return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)


def boxd_memory(task_id: str) -> int:
    """boxd's own memory in the task's units: its broker's (the socket units hold no process)."""
    unit = broker_unit(task_id)
    group = unit_cgroups([unit]).get(unit)
    return (cgroup_bytes(group) or 0) if group is not None else 0


def worker_memory(task_id: str) -> int:
    unit = worker_unit(task_id)
    group = unit_cgroups([unit]).get(unit)
    return (cgroup_bytes(group) or 0) if group is not None else 0


def waiting_spares() -> list[str]:
    """The ids of the spares whose broker and worker run: before any task, every worker unit
    is a spare's."""
    listed = run(
        "systemctl", "list-units", "--plain", "--no-legend", "--state=running", "box-task-*.service"
    )
    ids = [
        line.split()[0].removeprefix("box-task-").removesuffix(".service")
        for line in listed.splitlines()
        if line.strip()
    ]
    return [
        task_id for task_id in ids if unit_state(broker_unit(task_id))["ActiveState"] == "active"
    ]


def spares_memory() -> list[dict[str, int]]:
    def waiting() -> bool:
        # A worker started ahead has done its imports once it catches its wake-up signals.
        ids = waiting_spares()
        return len(ids) == SPARES and all(
            catches(int(unit_state(worker_unit(task_id))["MainPID"]), WAKES) for task_id in ids
        )

    if not wait_until(waiting, 120):
        sys.exit(f"boxd did not have its {SPARES} spares' brokers and workers waiting in 120 s")
    return [
        {"broker": boxd_memory(task_id), "worker": worker_memory(task_id)}
        for task_id in waiting_spares()
    ]


def wait_until(done: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_SECONDS)
    return True


def ask(task_id: str, method: str, path: str, body: bytes = b"") -> float:
    """Seconds from connecting to the task's broker socket to its whole answer (HTTP/1.0)."""
    head = f"{method} {path} HTTP/1.0\r\nHost: box\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    began = time.perf_counter()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(60)
        sock.connect(f"/var/lib/box/tasks/{task_id}/broker.sock")
        sock.sendall(head.encode() + b"\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    seconds = time.perf_counter() - began
    status = answer.split(b" ", 2)[1] if answer.startswith(b"HTTP/") else b"?"
    if status != b"200":
        sys.exit(f"{method} {path} to the broker of {task_id} answered {answer[:300]!r}")
    return seconds


def request(task_id: str, kind: str, number: int) -> float:
    if kind == "POST /step":
        return ask(task_id, "POST", "/step", json.dumps({"text": f"bench {number}"}).encode())
    method, path = kind.split()
    return ask(task_id, method, path)


def one_task(task_id: str, idle_seconds: float, exits: bool) -> dict[str, Any]:
    """Measures one task whose worker sleeps: idle, then its first requests after idle. A
    broker that never exits (a boxd before BOX_BROKER_IDLE_MS) is measured up, and no request
    of it is "after idle"."""
    broker = broker_unit(task_id)
    if not wait_until(lambda: logged(task_id).lines[:1] == [1], 120):
        sys.exit(f"task {task_id} logged no step in 120 s")
    measured: dict[str, Any] = {"cold": {}, "warm": {}, "started_again": 0}
    for number, kind in enumerate(KINDS):
        exited = exits and wait_until(
            lambda: unit_state(broker)["ActiveState"] == "inactive", idle_seconds * 3 + 30
        )
        if number == 0:
            measured["idle"] = boxd_memory(task_id)
            measured["worker"] = worker_memory(task_id)
            measured["exit"] = unit_state(broker)
            measured["exited"] = exited
        if exited:
            measured["cold"][kind] = request(task_id, kind, 100 * number)
            measured["started_again"] += unit_state(broker)["MainPID"] != "0"
        measured["warm"][kind] = statistics.median(
            request(task_id, kind, 100 * number + n + 1) for n in range(WARM_TRIES)
        )
        if number == 0:
            measured["up"] = boxd_memory(task_id)
    return measured


def measure(token: str, tasks: int, idle_ms: int) -> dict[str, Any]:
    total, top = import_profile()
    spares = spares_memory()
    DROP_IN.parent.mkdir(parents=True, exist_ok=True)
    DROP_IN.write_text(f"[Service]\nEnvironment=BOX_BROKER_IDLE_MS={idle_ms}\n")
    run("systemctl", "daemon-reload")
    started: list[str] = []
    try:
        body = {"prompt": "step ready\nsleep 3600", "worker": "fake", "title": "idle"}
        ids = asyncio.run(start_tasks(token, body, tasks, started))
        results: dict[str, Any] = {}
        for task_id in ids:
            # A broker that did not exit once is one that never does: the others are not
            # waited for.
            exits = all(one["exited"] for one in results.values())
            results[task_id] = one_task(task_id, idle_ms / 1000, exits)
    finally:
        if started:
            stop_unended(started)
        DROP_IN.unlink(missing_ok=True)
        run("systemctl", "daemon-reload")
    return {
        "import_ms": total,
        "import_top": top,
        "idle_ms": idle_ms,
        "tasks": results,
        "spares": spares,
    }


def table(result: dict[str, Any]) -> str:
    tasks = result["tasks"]
    out = [
        f"import boxd.broker.main: {result['import_ms']:.0f} ms (python -X importtime, "
        f"median of {IMPORT_TRIES}); the most of it:",
        *(f"  {ms:7.1f} ms  {name}" for ms, name in result["import_top"]),
        "",
        f"{len(tasks)} idle fake tasks (a step, then the worker sleeps); BOX_BROKER_IDLE_MS="
        f"{result['idle_ms']}; memory: {MEMORY_SOURCE}",
        "  boxd's own memory of a task (its broker's unit; its socket units hold no process)",
    ]

    def spread(values: list[float], unit: str, scale: float) -> str:
        return (
            f"median {statistics.median(values) * scale:7.1f} {unit}, "
            f"max {max(values) * scale:7.1f} {unit}"
        )

    one = list(tasks.values())
    worker = statistics.median(t["worker"] for t in one)
    out += [
        f"    broker up, just after a request   {spread([t['up'] for t in one], 'MiB', 2**-20)}",
        f"    idle                              {spread([t['idle'] for t in one], 'MiB', 2**-20)}",
        f"  the worker's (the agent's, not boxd's): {mib(worker)} median",
        "",
        "  first request after idle (its connection starts the broker) vs the broker up",
    ]
    for kind in KINDS:
        cold = [t["cold"][kind] for t in one if kind in t["cold"]]
        warm = [t["warm"][kind] for t in one]
        after = f"after idle {spread(cold, 'ms', 1000)}" if cold else "never idle (no exit)"
        out.append(f"    {kind:<12} {after};  warm {spread(warm, 'ms', 1000)}")
    exits = [t["exit"] for t in one]
    spares = result["spares"]
    out += [
        "",
        f"  {len(spares)} spares waiting for a task, each its broker and its worker started ahead"
        " (boxd's own, both)",
        f"    broker {spread([s['broker'] for s in spares], 'MiB', 2**-20)}",
        f"    worker {spread([s['worker'] for s in spares], 'MiB', 2**-20)}",
        "",
        f"  brokers that exited idle: {sum(t['exited'] for t in one)} of {len(one)}; their "
        f"units then: {', '.join(sorted({e['ActiveState'] + '/' + e['Result'] for e in exits}))}"
        f"; restarts systemd counted (failures): {sum(int(e['NRestarts']) for e in exits)}; "
        f"started again by a connection to their socket: "
        f"{sum(t['started_again'] for t in one)} of {len(KINDS) * len(one)}",
    ]
    return "\n".join(out)


def run_in_machine(tasks: int, idle_ms: int) -> int:
    """As bench.in_machine's, but with the bench package beside this file: it uses bench.load's
    measures, and runs as `python -m bench.idle_memory`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from testbed.machine import Machine, install_boxd

    here = Path(__file__).resolve().parent
    with Machine() as machine:
        install_boxd(machine)
        token = machine.run(BOXCTL, "token", "create", "--name", "bench").stdout.strip()
        target = machine.root / "tmp" / "bench-idle" / "bench"
        target.mkdir(parents=True)
        for name in ("__init__.py", "in_machine.py", "load.py", "idle_memory.py"):
            shutil.copy(here / name, target / name)
        done = machine.run(
            "sh",
            "-c",
            f"cd /tmp/bench-idle && {PYTHON} -m bench.idle_memory --inside {token} "
            f"--tasks {tasks} --idle-ms {idle_ms}",
            check=False,
            timeout=3600,
        )
        print(done.stdout, end="")
        print(done.stderr, end="", file=sys.stderr)
        return done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--inside", metavar="TOKEN", help="measure here, with this token")
    parser.add_argument("--tasks", type=int, default=TASKS, help="idle tasks")
    parser.add_argument("--idle-ms", type=int, default=IDLE_MS, help="BOX_BROKER_IDLE_MS")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    arguments = parser.parse_args()
    if arguments.inside:
        result = measure(arguments.inside, arguments.tasks, arguments.idle_ms)
        print(json.dumps(result) if arguments.json else table(result))
        return
    sys.exit(run_in_machine(arguments.tasks, arguments.idle_ms))


if __name__ == "__main__":
    main()
