"""How fast a task's broker answers `POST /step` and `POST /call`, next to the floor: a SQLite
insert and commit (WAL, `synchronous=FULL`) followed by `syncfs` on the task's directory, the
least a durable step can cost, measured in the same machine, run and directory.

Run as root from the repository: `python -m bench.broker`. It boots a test machine, installs this
checkout, makes a token, copies this file in and measures there; a minute or two in all.

- One task: a fake task with `tools: ["echo.say"]` and the prompt `sleep 3600` keeps its broker
  up. A client running as the task's own user (`runuser -u box-<id>`) sends 300 sequential
  `POST /step` to `BOX_SOCKET`, then 300 sequential `POST /call` of `echo.say`, each with a
  fresh key so the tool runs and both ends of the call are logged. Printed: p50 and p99 latency
  and requests per second of each kind. Then the floor, one operation at a time, 300 times.
- 20 tasks at once: 20 such tasks, 20 clients in parallel (each as its own task's user), 100
  requests of each kind each; printed: aggregate requests per second and pooled p50 and p99.
  Then the floor in 20 processes at once, each on its own database in its own task's directory.
- The ratios: boxd p50 / floor p50, and floor ops/s / boxd steps/s.

Each measure is taken in ROUNDS rounds, boxd's steps, its calls and the floor in turn, and pooled:
on a shared machine the load changes by the second, and a floor measured once, after boxd,
made the ratios wander. Under each of boxd's lines, the CPU time its parts spent per request,
from their units' cgroups (cpu.stat): the manager, the brokers, dbus-daemon and journald. That
figure hardly moves with the machine's load, where latencies do.

Every client waits, after a few warm-up requests that are not counted, for one common start
time, so the parallel runs overlap fully and Python's start-up is not timed. Every loop is
bounded in count and in time; the tasks are stopped with `boxctl stop` at the end.
"""

import argparse
import asyncio
import ctypes
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from boxd.workers.unix_http import Connections

BOX_HOME = Path("/var/lib/box")
API = "http://127.0.0.1:7700/api/tasks"
TOOL = "echo.say"
ONE_COUNT = 300
TASKS = 20
EACH_COUNT = 100
WARM_UP = 3
# Bounds: one request, one client's or floor process's whole run, one process from outside.
REQUEST_SECONDS = 30.0
RUN_SECONDS = 120.0
PROCESS_SECONDS = RUN_SECONDS + 60.0
# Lead time before the common start, for every process to start Python and warm up.
LEAD_SECONDS = 4.0
KINDS = ("step", "call")
# Each measure is taken in rounds, boxd's requests and the floor in turn, so a change in the
# machine's load (a shared machine) falls on both alike.
ROUNDS = 3
# The parts of boxd whose CPU time a request costs, by their units' cgroups (cgroup v2
# cpu.stat): the manager, the brokers (their slice), the apps' runners (theirs: echo.say runs
# in box-app@echo.service), the bus and the journal.
PARTS = {
    "manager": "boxd.service",
    "brokers": "box-broker@",
    "apps": "box-app@",
    "dbus-daemon": "dbus.service",
    "journald": "systemd-journald.service",
}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def wait_until(at: float) -> None:
    pause = at - time.time()
    if pause > 0:
        time.sleep(pause)


def report(latencies: list[float], started: float, ended: float) -> None:
    """What a client or floor process prints for the orchestrator: one line of JSON."""
    print(json.dumps({"latencies": latencies, "started": started, "ended": ended}), flush=True)


# --- the client, run as the task's user ---------------------------------------------------------


async def client(socket: str, kind: str, count: int, label: str, at: float) -> None:
    """`count` sequential requests of one kind to the broker at `socket`, each timed. The client
    is boxd's own workers' (boxd.workers.unix_http, a connection kept open), as the fake and
    Droid workers and the MCP relay talk to their broker: aiohttp's client, which this bench
    used before, spent some 0.3 ms of its own on each request, on the clock."""
    connections = Connections(socket)

    async def send(number: str) -> None:
        if kind == "step":
            path = "/step"
            body: dict[str, Any] = {"text": f"bench {label} {number}", "data": {"n": number}}
        else:
            path = "/call"
            body = {"tool": TOOL, "input": {"text": "hi"}, "key": f"bench-{label}-{number}"}
        async with asyncio.timeout(REQUEST_SECONDS):
            status, answer = await connections.exchange("POST", path, json.dumps(body).encode())
        if status != 200:
            sys.exit(f"POST {path} answered {status}: {answer}")
        if kind == "call" and answer != {"ok": True, "output": {"text": "hi"}}:
            sys.exit(f"POST /call {TOOL} answered {answer}")

    for number in range(WARM_UP):
        await send(f"warm-{number}")
    await asyncio.to_thread(wait_until, at)
    latencies: list[float] = []
    started = time.time()
    deadline = time.monotonic() + RUN_SECONDS
    for number in range(count):
        if time.monotonic() > deadline:
            break
        begun = time.perf_counter()
        await send(str(number))
        latencies.append(time.perf_counter() - begun)
    report(latencies, started, time.time())


# --- the floor, run as root ---------------------------------------------------------------------


def floor(directory: Path, name: str, count: int, at: float) -> None:
    """`count` times, one at a time: insert a row and commit (WAL, synchronous=FULL), then
    syncfs on `directory`. The database is `name` in `directory`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with closing(sqlite3.connect(directory / name, isolation_level=None)) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, data TEXT)")
            wait_until(at)
            latencies: list[float] = []
            started = time.time()
            deadline = time.monotonic() + RUN_SECONDS
            for number in range(count):
                if time.monotonic() > deadline:
                    break
                begun = time.perf_counter()
                data = json.dumps({"text": f"floor {number}", "data": {"n": number}})
                db.execute("BEGIN")
                db.execute("INSERT INTO events (data) VALUES (?)", (data,))
                db.execute("COMMIT")
                if libc.syncfs(fd) != 0:
                    sys.exit(f"syncfs on {directory} failed: {os.strerror(ctypes.get_errno())}")
                latencies.append(time.perf_counter() - begun)
            report(latencies, started, time.time())
    finally:
        os.close(fd)


# --- the orchestrator, run as root in the machine -----------------------------------------------


# Where the cgroup v2 tree is: its own mount on a hybrid system (as in the test machine).
CGROUP_V2 = next(
    (
        root
        for root in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
        if (root / "cgroup.procs").exists()
    ),
    Path("/sys/fs/cgroup"),
)


def unit_property(unit: str, name: str) -> str:
    done = subprocess.run(
        ["systemctl", "show", "-p", name, "--value", unit],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def part_cgroups(broker_unit: str) -> dict[str, Path]:
    """Each part's cgroup; the brokers' is the slice that holds every task's broker (made when
    the first broker starts, as the socket's first connection starts it), the apps' the slice
    of every app's runner."""
    found = {}
    for part, unit in PARTS.items():
        if unit.endswith("@"):
            instance = (
                broker_unit if unit == "box-broker@" else f"{unit}{TOOL.split('.')[0]}.service"
            )
            slice_ = unit_property(instance, "Slice")
            group = unit_property(slice_, "ControlGroup") or f"/system.slice/{slice_}"
        else:
            group = unit_property(unit, "ControlGroup")
        found[part] = CGROUP_V2 / group.lstrip("/")
    return found


def cpu_seconds(groups: dict[str, Path]) -> dict[str, float]:
    used = dict.fromkeys(groups, 0.0)
    for part, group in groups.items():
        stat = group / "cpu.stat"
        for line in stat.read_text().splitlines() if stat.exists() else ():
            name, value = line.split()
            if name == "usage_usec":
                used[part] = int(value) / 1e6
    return used


@dataclass
class Task:
    id: str
    user: str

    @property
    def directory(self) -> Path:
        return BOX_HOME / "tasks" / self.id

    @property
    def socket(self) -> Path:
        return self.directory / "broker.sock"


@dataclass
class Figures:
    """One kind of operation, measured in one or more processes at once."""

    latencies: list[float]
    seconds: float
    # CPU seconds each of boxd's parts (PARTS) spent from the common start to the end.
    cpu: dict[str, float] = field(default_factory=dict)

    @classmethod
    def pooled(cls, rounds: list["Figures"]) -> "Figures":
        cpu = {part: sum(one.cpu.get(part, 0.0) for one in rounds) for part in PARTS}
        latencies = [value for one in rounds for value in one.latencies]
        return cls(latencies, sum(one.seconds for one in rounds), cpu)

    def cpu_line(self) -> str:
        each = {part: used / len(self.latencies) * 1e6 for part, used in self.cpu.items()}
        parts = "   ".join(f"{part} {each[part]:5.0f}" for part in PARTS)
        return f"{'':<56}CPU µs each: {parts}   all {sum(each.values()):5.0f}"

    @classmethod
    def of(cls, reports: list[dict[str, Any]]) -> "Figures":
        latencies = [value for one in reports for value in one["latencies"]]
        started = min(one["started"] for one in reports)
        ended = max(one["ended"] for one in reports)
        return cls(latencies, ended - started)

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 0.5)

    @property
    def per_second(self) -> float:
        return len(self.latencies) / self.seconds

    def line(self, name: str) -> str:
        return (
            f"  {name:<52} p50 {self.p50 * 1000:6.2f} ms   "
            f"p99 {percentile(self.latencies, 0.99) * 1000:6.2f} ms   "
            f"{self.per_second:7.1f}/s  ({len(self.latencies)} in {self.seconds:.2f} s)"
        )


async def run_all(commands: list[list[str]], expected: int) -> Figures:
    """Runs the processes at once, each printing one report, and pools their figures."""
    processes = [
        await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        for command in commands
    ]

    async def finish(process: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
        try:
            return await asyncio.wait_for(process.communicate(), PROCESS_SECONDS)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise

    try:
        outputs = await asyncio.gather(*(finish(process) for process in processes))
    except TimeoutError:
        sys.exit(f"a process did not finish within {PROCESS_SECONDS:g} s")
    reports = []
    for command, process, (stdout, stderr) in zip(commands, processes, outputs, strict=True):
        if process.returncode != 0:
            sys.exit(
                f"{' '.join(command)} exited with status {process.returncode}: "
                f"{stderr.decode(errors='replace').strip()}"
            )
        reports.append(json.loads(stdout.decode().splitlines()[-1]))
    figures = Figures.of(reports)
    if len(figures.latencies) != expected:
        print(f"  (bounded by time: {len(figures.latencies)} of {expected} done)")
    return figures


def client_command(task: Task, kind: str, count: int, label: str, at: float) -> list[str]:
    return [
        "runuser",
        "-u",
        task.user,
        "--",
        sys.executable,
        str(Path(__file__).resolve()),
        "--client",
        str(task.socket),
        "--kind",
        kind,
        "--count",
        str(count),
        "--label",
        label,
        "--at",
        repr(at),
    ]


def floor_command(directory: Path, name: str, count: int, at: float) -> list[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--floor",
        str(directory),
        "--db",
        name,
        "--count",
        str(count),
        "--at",
        repr(at),
    ]


async def start_tasks(token: str, count: int) -> list[Task]:
    headers = {"Authorization": f"Bearer {token}"}
    body = {"title": "bench broker", "prompt": "sleep 3600", "worker": "fake", "tools": [TOOL]}
    tasks: list[Task] = []
    timeout = aiohttp.ClientTimeout(total=REQUEST_SECONDS)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for _ in range(count):
            async with http.post(API, json=body, headers=headers) as response:
                task = await response.json()
            if response.status != 201 or task["state"] != "running":
                sys.exit(f"the task did not start: {task}")
            tasks.append(Task(task["id"], task["user"]))
    deadline = time.monotonic() + 60
    while not all(task.socket.is_socket() for task in tasks):
        if time.monotonic() > deadline:
            sys.exit("the tasks' broker sockets did not appear within 60 s")
        await asyncio.sleep(0.1)
    return tasks


def file_system(path: Path) -> str:
    """The type and device of the mount that holds `path`, as /proc/self/mounts says."""
    best = ("", "?", "?")
    for line in Path("/proc/self/mounts").read_text().splitlines():
        device, point, kind = line.split()[:3]
        inside = str(path) == point or str(path).startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, kind, device)
    return f"{best[1]} ({best[2]} on {best[0]})"


async def measure(token: str, one_count: int, task_count: int, each_count: int) -> None:
    tasks = await start_tasks(token, task_count)
    try:
        await _measure(tasks, one_count, each_count)
    finally:
        for task in tasks:
            for suffix in ("", "-wal", "-shm"):
                (task.directory / f"bench-floor.db{suffix}").unlink(missing_ok=True)
            await stop_task(task)


async def stop_task(task: Task) -> None:
    stop = await asyncio.create_subprocess_exec(
        "boxctl",
        "stop",
        task.id,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, said = await asyncio.wait_for(stop.communicate(), REQUEST_SECONDS)
    except TimeoutError:
        stop.kill()
        await stop.wait()
        print(f"boxctl stop {task.id} did not finish within {REQUEST_SECONDS:g} s")
        return
    if stop.returncode != 0:
        print(f"boxctl stop {task.id}: {said.decode(errors='replace').strip()}")


async def rounds(
    commands: Callable[[str, int, str, float], list[list[str]]],
    count: int,
    processes: int,
    groups: dict[str, Path],
) -> dict[str, Figures]:
    """`count` requests of each kind per process, and as many floor operations, in ROUNDS
    rounds; `commands(kind, count, label, at)` are the processes of one kind's run."""
    taken: dict[str, list[Figures]] = {kind: [] for kind in (*KINDS, "floor")}
    for number in range(ROUNDS):
        each = count // ROUNDS + (number < count % ROUNDS)
        for kind in taken:
            at = time.time() + LEAD_SECONDS
            run = asyncio.create_task(
                run_all(commands(kind, each, f"r{number}", at), each * processes)
            )
            # From the common start: the clients' warm-up (and a broker's start) is not counted.
            await asyncio.sleep(max(0.0, at - time.time()))
            before = cpu_seconds(groups)
            figures = await run
            after = cpu_seconds(groups)
            figures.cpu = {part: after[part] - before[part] for part in groups}
            taken[kind].append(figures)
    return {kind: Figures.pooled(figures) for kind, figures in taken.items()}


async def _measure(tasks: list[Task], one_count: int, each_count: int) -> None:
    one = tasks[0]
    print(f"broker round trips; BOX_HOME {BOX_HOME} is {file_system(BOX_HOME)}")
    print(f"{os.cpu_count()} CPUs; floor: SQLite insert + commit (WAL, synchronous=FULL), syncfs")
    print(
        f"each measure in {ROUNDS} rounds, boxd and the floor in turn; CPU µs each: the CPU time "
        "of boxd's parts (their cgroups) per request, from the clients' common start"
    )
    print()
    groups = part_cgroups(f"box-broker@{one.id}.service")

    def single(kind: str, count: int, label: str, at: float) -> list[list[str]]:
        if kind == "floor":
            return [floor_command(one.directory, "bench-floor.db", count, at)]
        return [client_command(one, kind, count, f"one-{label}", at)]

    print(f"one task, {one_count} requests of each kind, one at a time")
    alone = await rounds(single, one_count, 1, groups)
    print(alone["step"].line("POST /step"))
    print(alone["step"].cpu_line())
    print(alone["call"].line(f"POST /call {TOOL}"))
    print(alone["call"].cpu_line())
    print(alone["floor"].line(f"floor in {one.directory}"))
    print()

    def parallel(kind: str, count: int, label: str, at: float) -> list[list[str]]:
        if kind == "floor":
            return [floor_command(t.directory, "bench-floor.db", count, at) for t in tasks]
        return [client_command(t, kind, count, f"many-{label}", at) for t in tasks]

    total = len(tasks) * each_count
    print(
        f"{len(tasks)} tasks at once, {each_count} requests of each kind per task ({total} in all)"
    )
    many = await rounds(parallel, each_count, len(tasks), groups)
    print(many["step"].line("POST /step, all clients"))
    print(many["step"].cpu_line())
    print(many["call"].line(f"POST /call {TOOL}, all clients"))
    print(many["call"].cpu_line())
    print(many["floor"].line(f"floor, {len(tasks)} processes, one database each"))
    print()

    print("ratios")
    at_once = f"{len(tasks)} tasks at once"
    ratios = [
        *(
            (f"boxd {kind} p50 / floor p50, one task", alone[kind].p50 / alone["floor"].p50)
            for kind in KINDS
        ),
        *(
            (f"boxd {kind} p50 / floor p50, {at_once}", many[kind].p50 / many["floor"].p50)
            for kind in KINDS
        ),
        (
            "floor ops/s / boxd steps/s, one task",
            alone["floor"].per_second / alone["step"].per_second,
        ),
        (
            f"floor ops/s / boxd steps/s, {at_once}",
            many["floor"].per_second / many["step"].per_second,
        ),
    ]
    for name, ratio in ratios:
        print(f"  {name:<52} {ratio:6.2f}")


# --- the host side ------------------------------------------------------------------------------


def run_in_machine(one_count: int, task_count: int, each_count: int) -> None:
    from testbed.machine import Machine, install_boxd

    with Machine() as machine:
        install_boxd(machine)
        token = machine.run("boxctl", "token", "create", "--name", "bench").stdout.strip()
        # The default maxRunningTasks follows the cores (4 each): on a small machine the 20
        # tasks would queue, not run at once.
        machine.run("boxctl", "settings", "set", "maxRunningTasks", str(max(task_count, 1)))
        target = machine.root / "tmp" / "broker.py"
        shutil.copy(__file__, target)
        # The clients run as the tasks' users.
        target.chmod(0o644)
        done = machine.run(
            "/usr/lib/boxd/venv/bin/python",
            "/tmp/broker.py",
            "--inside",
            token,
            "--count",
            str(one_count),
            "--tasks",
            str(task_count),
            "--each",
            str(each_count),
            timeout=900,
        )
        print(done.stdout, end="")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--inside", metavar="TOKEN", help="measure here, with this token")
    parser.add_argument("--client", metavar="SOCKET", help="be one client of this broker")
    parser.add_argument("--floor", metavar="DIR", help="be one floor process in this directory")
    parser.add_argument("--kind", choices=KINDS, default="step", help="the client's requests")
    parser.add_argument("--label", default="one", help="the client's part of its keys")
    parser.add_argument("--db", default="bench-floor.db", help="the floor's database file")
    parser.add_argument("--at", type=float, default=0.0, help="when to start (time.time())")
    parser.add_argument("--count", type=int, default=ONE_COUNT, help="requests, one task")
    parser.add_argument("--tasks", type=int, default=TASKS, help="tasks at once")
    parser.add_argument("--each", type=int, default=EACH_COUNT, help="requests per task at once")
    arguments = parser.parse_args()
    if arguments.client:
        asyncio.run(
            client(arguments.client, arguments.kind, arguments.count, arguments.label, arguments.at)
        )
    elif arguments.floor:
        floor(Path(arguments.floor), arguments.db, arguments.count, arguments.at)
    elif arguments.inside:
        asyncio.run(measure(arguments.inside, arguments.count, arguments.tasks, arguments.each))
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        run_in_machine(arguments.count, arguments.tasks, arguments.each)


if __name__ == "__main__":
    main()
