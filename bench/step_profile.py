"""Where the CPU of a step goes: the CPU time of each of boxd's processes on a step's path, by
what runs it (Python's interpreter, the kernel, the C libraries), sampled with perf(1).

Run as root from the repository: `python -m bench.step_profile` (`--tasks 20` for twenty tasks
stepping at once, `--kind call` for no-op keyed calls). It needs perf on the host (Debian:
`apt install linux-perf`); test machines share the host's kernel, so perf on the host samples
the processes in one. A minute or so.

It boots a test machine, installs this checkout and starts the tasks as `bench.broker` does
(bench/broker.py, copied in beside this file). Each task's client, run as the task's user, sends
its requests one at a time; meanwhile perf samples, at FREQUENCY a second, the manager, the
tasks' brokers, dbus-daemon and journald, from a moment before the clients' common start (a
machine at rest costs those parts under 1 ms of CPU in 2 s) to the moment the last client ends.
The samples come out as CPU µs a request: a sample stands for 1/FREQUENCY s of CPU.

Printed, for each process: its CPU µs a request in all, and of it in Python's interpreter (the
python3.11 binary: bytecode and objects), in the kernel (system calls, wake-ups, the file
system), and in each library or extension module with a share of 1% or more. The clients are not
sampled: they are the agent's CPU, not boxd's, though they share the machine's cores.
"""

import argparse
import asyncio
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

FREQUENCY = 2000
COUNT = 2000
SETTLE_SECONDS = 1.0
READY_SECONDS = 120.0
RUN_SECONDS = 300.0
# What the inside part and the host part tell each other, in the machine's /tmp.
PIDS = "step_profile.json"
GO = "step_profile.go"
DONE = "step_profile.done"
# Each process's unit, by the name it is printed under.
UNITS = {
    "manager": "boxd.service",
    "dbus-daemon": "dbus.service",
    "journald": "systemd-journald.service",
}
INTERPRETER = "python3.11"
KERNEL = "[kernel.kallsyms]"
# perf report: samples by shared object, as text.
_REPORT = (
    *("perf", "report", "--no-children", "--sort", "dso", "-g", "none"),
    *("--stdio", "-F", "sample,dso"),
)


# --- inside the test machine ----------------------------------------------------------------


async def inside(token: str, kind: str, tasks_count: int, count: int) -> None:
    # bench/broker.py, copied in beside this file: the machine has boxd's wheel, not this tree.
    sys.path.insert(0, "/tmp")
    bench_broker = importlib.import_module("broker")

    tmp = Path("/tmp")
    tasks = await bench_broker.start_tasks(token, tasks_count)
    warm_up = bench_broker.WARM_UP
    warm = [bench_broker.client_command(task, kind, warm_up, "warm", time.time()) for task in tasks]
    await bench_broker.run_all(warm, warm_up * len(tasks))
    pids = {name: [bench_broker.unit_property(unit, "MainPID")] for name, unit in UNITS.items()}
    pids["brokers"] = [
        bench_broker.unit_property(f"box-broker@{task.id}.service", "MainPID") for task in tasks
    ]
    (tmp / PIDS).write_text(json.dumps(pids))
    deadline = time.monotonic() + READY_SECONDS
    while not (tmp / GO).exists():
        if time.monotonic() > deadline:
            sys.exit("the host did not start perf in time")
        await asyncio.sleep(0.05)
    at = time.time() + SETTLE_SECONDS
    clients = [bench_broker.client_command(task, kind, count, "profile", at) for task in tasks]
    figures = await bench_broker.run_all(clients, count * len(tasks))
    (tmp / DONE).write_text(json.dumps({"requests": len(figures.latencies)}))
    print(
        f"{len(tasks)} task(s), {len(figures.latencies)} POST /{kind} in {figures.seconds:.2f} s: "
        f"p50 {figures.p50 * 1000:.2f} ms, {figures.per_second:.0f}/s",
        flush=True,
    )
    for task in tasks:
        await bench_broker.stop_task(task)


# --- on the host ------------------------------------------------------------------------------


def host_pids(leader: int) -> dict[int, int]:
    """The host's number of each process of the test machine whose init is `leader`, by the
    number the machine knows it by (its last NSpid): in that machine's pid namespace only, as
    another machine on this host has processes of the same numbers."""
    namespace = os.readlink(f"/proc/{leader}/ns/pid")
    found: dict[int, int] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if os.readlink(status.parent / "ns" / "pid") != namespace:
                continue
            lines = status.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith("NSpid:"):
                numbers = [int(n) for n in line.split()[1:]]
                found[numbers[-1]] = numbers[0]
    return found


def by_library(data: Path) -> dict[str, int]:
    """Samples by shared object, from a perf.data file."""
    report = subprocess.run(
        [*_REPORT, "-i", str(data)],
        capture_output=True,
        text=True,
        check=True,
    )
    return samples_in(report.stdout)


def samples_in(report: str) -> dict[str, int]:
    """Samples by shared object, from `perf report -F sample,dso`'s text: a count and a name a
    line, under comment lines that start with #."""
    samples: dict[str, int] = defaultdict(int)
    for line in report.splitlines():
        fields = line.split(maxsplit=1)
        if len(fields) == 2 and fields[0].isdigit():
            samples[fields[1].strip()] += int(fields[0])
    return dict(samples)


def per_request(samples: dict[str, int], requests: int) -> dict[str, float]:
    """CPU µs a request of each shared object: a sample stands for 1/FREQUENCY s."""
    return {library: count / FREQUENCY / requests * 1e6 for library, count in samples.items()}


def short(library: str) -> str:
    """`message_bus.cpython-311-x86_64-linux-gnu.so` -> `message_bus`; `libc.so.6` -> `libc`."""
    return library.split(".cpython-")[0].split(".so")[0]


def show(name: str, samples: dict[str, int], requests: int) -> None:
    each = per_request(samples, requests)
    total = sum(each.values())
    interpreter = each.pop(INTERPRETER, 0.0)
    kernel = each.pop(KERNEL, 0.0)
    python = f"Python's interpreter {interpreter:4.0f}, " if interpreter else ""
    print(f"  {name:<12} {total:6.0f} µs a request: {python}the kernel {kernel:4.0f}")
    rest = sorted(each.items(), key=lambda item: -item[1])
    shown = [f"{short(library)} {value:.0f}" for library, value in rest if value >= total / 100]
    if shown:
        print(f"  {'':<12} {'':>6}    of the rest: {', '.join(shown)}")


def run(kind: str, tasks_count: int, count: int) -> None:
    if shutil.which("perf") is None:
        sys.exit("bench.step_profile needs perf on this host (Debian: apt install linux-perf)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.in_machine import PYTHON
    from testbed.machine import Machine, install_boxd

    with Machine() as machine:
        install_boxd(machine)
        token = machine.run("boxctl", "token", "create", "--name", "bench").stdout.strip()
        machine.run("boxctl", "settings", "set", "maxRunningTasks", str(max(tasks_count, 1)))
        tmp = machine.root / "tmp"
        for copied in (Path(__file__), Path(__file__).with_name("broker.py")):
            shutil.copy(copied, tmp / copied.name)
            (tmp / copied.name).chmod(0o644)
        arguments = ["--inside", token, "--kind", kind, "--tasks", str(tasks_count)]
        script = f"/tmp/{Path(__file__).name}"
        inner = machine.spawn(PYTHON, script, *arguments, "--count", str(count))
        deadline = time.monotonic() + READY_SECONDS
        while not (tmp / PIDS).exists():
            if inner.poll() is not None or time.monotonic() > deadline:
                out, err = inner.communicate()
                sys.exit(f"the tasks did not get ready:\n{out}{err}")
            time.sleep(0.1)
        pids = json.loads((tmp / PIDS).read_text())
        perfs = {}
        kept = Path(os.environ.get("TMPDIR", "/tmp"))
        on_host = host_pids(machine.leader)
        for name, inner_pids in pids.items():
            missing = [pid for pid in inner_pids if int(pid) not in on_host]
            if missing:
                sys.exit(f"no process on this host is the test machine's {name}, pid {missing}")
            numbers = ",".join(str(on_host[int(pid)]) for pid in inner_pids)
            data = kept / f"step_profile.{name}.data"
            perfs[name] = (
                subprocess.Popen(
                    ["perf", "record", "-F", str(FREQUENCY), "-p", numbers, "-o", str(data)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                ),
                data,
            )
        # perf attaches within a moment; the clients start a second after the go.
        time.sleep(0.5)
        (tmp / GO).write_text("go")
        deadline = time.monotonic() + RUN_SECONDS
        while not (tmp / DONE).exists():
            if inner.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for process, _ in perfs.values():
            process.send_signal(signal.SIGINT)
        for process, _ in perfs.values():
            process.wait(timeout=60)
        out, err = inner.communicate(timeout=RUN_SECONDS)
        if inner.returncode != 0 or not (tmp / DONE).exists():
            sys.exit(f"the run inside the test machine failed:\n{out}{err}")
        requests = int(json.loads((tmp / DONE).read_text())["requests"])
    print(out, end="")
    print(f"CPU a request, sampled by perf at {FREQUENCY}/s while the clients ran")
    for name in ("manager", "brokers", "dbus-daemon", "journald"):
        _, data = perfs[name]
        show(name, by_library(data), requests)
        data.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--inside", metavar="TOKEN", help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=("step", "call"), default="step")
    parser.add_argument("--tasks", type=int, default=1, help="tasks stepping at once")
    parser.add_argument("--count", type=int, default=COUNT, help="requests per task")
    arguments = parser.parse_args()
    if arguments.inside:
        asyncio.run(inside(arguments.inside, arguments.kind, arguments.tasks, arguments.count))
    else:
        run(arguments.kind, arguments.tasks, arguments.count)


if __name__ == "__main__":
    main()
