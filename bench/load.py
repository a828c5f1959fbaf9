"""Load: many fake tasks at once, each logging many steps and making calls; none may be lost.

Run as root from the repository: `python -m bench.load` (100 tasks, 200 lines each of which
20 are calls; `--tasks`, `--lines`, `--calls` for other sizes). It boots a test machine,
installs this checkout, copies this file in and runs it there as root; tests/vm/test_load.py
runs a small size of the same thing in CI.

- Each task is a `fake` task on a workspace of its own with `tools: ["echo.say"]`. Its script
  is `ask go?`, then `--lines` lines, every (lines / calls)-th a `call echo.say` and the others
  `step`; the fake worker logs a step after every line, so a task logs lines + 1 steps and makes
  `--calls` calls. `maxRunningTasks` is raised (settings, as the owner) so all run at once.
- Idle: the `ask` holds every task waiting for its owner until all are; then every approval is
  answered yes at once, so the tasks really run at the same time.
- Latency: each worker times every step and call it sends, from sending to the broker's answer,
  and prints them when it ends (boxd/workers/fake.py, ROUND_TRIPS); pooled here: p50, p99, max.
- Memory of a task: memory.current of its broker's cgroup (box-broker@<id>.service) and its
  worker's (box-task-<id>.service), when all are idle, and sampled every 5 s while they run.
  (cgroup limits are not enforced in the test machine, but the counts are real.)
- The manager (boxd.service): its main process's resident memory (VmRSS), its cgroup's
  memory.current and its open file descriptors, before (after one warm-up task ended), with all
  tasks idle, at their peak while they run, and after all ended and were cleared up (their
  units and network namespaces gone).

Checks, printed under the table (exit status 1 when one fails): every task ended `done`; its
worker was answered for every step and call; every step is in the record (box.db) exactly once
with its line; every call has exactly one `tool.result`, ok; and the manager's descriptors
after are at most FD_SLACK more than before.
"""

import argparse
import asyncio
import json
import os
import secrets
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from boxd.manager.units.netns import netns_path
from boxd.wire.models.settings import MAX_RUNNING_TASKS

BOX_HOME = Path("/var/lib/box")
DATABASE = BOX_HOME / "box.db"
API = "http://127.0.0.1:7700/api/tasks"
BOXCTL = "/usr/lib/boxd/venv/bin/boxctl"
# systemd's own hierarchy: cgroup v2, or its v2 part on a hybrid host (as the test machines
# here are: their kernel's memory controller is v1 and not per unit).
CGROUPS = next(
    (
        p
        for p in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
        if (p / "cgroup.procs").exists()
    ),
    Path("/sys/fs/cgroup"),
)
MANAGER = "boxd.service"
# The web gateway: boxd's own too, one for the box, whatever the number of tasks.
WEB = "boxd-web.service"
TOOL = "echo.say"
# The fake worker's line with its timings (boxd.workers.fake.ROUND_TRIPS; this file runs alone).
ROUND_TRIPS = "fake worker round trips: "
TASKS, LINES, CALLS = 100, 200, 20
# How many more descriptors the manager may hold after the tasks than before: it opens some
# lazily (a journal reader for a failed worker's last words, the executor's threads' files).
FD_SLACK = 8
STARTING_AT_ONCE = 8
SAMPLE_SECONDS = 5.0
POLL_SECONDS = 0.2
ENDED = ("done", "failed", "undone")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def script(lines: int, calls: int) -> str:
    """`ask go?`, then `lines` lines of which `calls` are calls, spread evenly."""
    every = lines // calls if calls else lines + 1
    body = [
        f'call {TOOL} {{"text": "call {n}"}}'
        if calls and n % every == 0 and n // every <= calls
        # Some text, as an agent's step has.
        else f"step step {n} of {lines}: reading, thinking, writing"
        for n in range(1, lines + 1)
    ]
    return "\n".join(["ask go?", *body])


def call_lines(prompt: str) -> list[int]:
    """The line numbers (from 1) of the script's calls: their keys are line-N."""
    return [n for n, line in enumerate(prompt.splitlines(), 1) if line.startswith("call ")]


def run(*argv: str, timeout: float = 120) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited with status {done.returncode}: {done.stderr.strip()}")
    return done.stdout


# --- what is measured ---------------------------------------------------------------------------


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError, OSError):
        return None


def pss(pid: str) -> int:
    """A process's proportional set size: its own pages, and its share of those it shares (the
    Python interpreter and libraries every task's processes map)."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    return sum(
        int(line.split()[1]) * 1024 for line in rollup.splitlines() if line.startswith("Pss:")
    )


def cgroup_bytes(group: Path) -> int | None:
    """memory.current where the kernel counts memory per unit; else the PSS of the unit's
    processes. None once the cgroup is gone."""
    counted = read_int(group / "memory.current")
    if counted is not None:
        return counted
    try:
        pids = [
            pid
            for d in (group, *group.rglob("*/"))
            for pid in (d / "cgroup.procs").read_text().split()
        ]
    except OSError:
        return None
    return sum(pss(pid) for pid in pids)


MEMORY_SOURCE = (
    "memory.current"
    if (CGROUPS / "init.scope" / "memory.current").exists()
    else "PSS of its processes"
)


@dataclass
class ManagerUse:
    rss: int
    cgroup: int
    fds: int
    open_files: list[str]
    # The web gateway's cgroup, as the manager's.
    web: int
    # The brokers and workers of the spares (task ids made ahead, boxd/manager/spares.py): boxd
    # keeps them ready whatever runs, and they are its own until a task takes one.
    spares: int

    @classmethod
    def now(cls, tasks: frozenset[str] = frozenset()) -> "ManagerUse":
        """Now; the running broker and worker units of ids not in `tasks` are the spares'."""
        pid = int(run("systemctl", "show", "-p", "MainPID", "--value", MANAGER).strip())
        if pid == 0:
            sys.exit(f"{MANAGER} is not running")
        status = Path(f"/proc/{pid}/status").read_text()
        rss = next(int(line.split()[1]) * 1024 for line in status.splitlines() if "VmRSS" in line)
        group = run("systemctl", "show", "-p", "ControlGroup", "--value", MANAGER).strip()
        targets = []
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                targets.append(os.readlink(fd))
            except FileNotFoundError:
                continue
        web = run("systemctl", "show", "-p", "ControlGroup", "--value", WEB).strip()
        return cls(
            rss,
            cgroup_bytes(CGROUPS / group.lstrip("/")) or 0,
            len(targets),
            targets,
            (cgroup_bytes(CGROUPS / web.lstrip("/")) or 0) if web else 0,
            sum(cgroup_bytes(group) or 0 for group in spare_cgroups(tasks).values()),
        )


def spare_cgroups(tasks: frozenset[str]) -> dict[str, Path]:
    """The cgroups of the brokers and workers running for ids that are not `tasks`."""
    listed = run(
        "systemctl",
        "list-units",
        "--plain",
        "--no-legend",
        "--state=active",
        broker_unit("*"),
        worker_unit("*"),
    )
    taken = {unit for task_id in tasks for unit in (broker_unit(task_id), worker_unit(task_id))}
    units = [line.split()[0] for line in listed.splitlines() if line.strip()]
    spares = [unit for unit in units if unit not in taken]
    if not spares:
        return {}
    return {unit: group for unit, group in unit_cgroups(spares).items() if running(group)}


def unit_cgroups(units: list[str]) -> dict[str, Path]:
    """Each loaded unit's cgroup directory, asked of systemd in one call."""
    shown = run("systemctl", "show", "-p", "Id", "-p", "ControlGroup", *units)
    found: dict[str, Path] = {}
    for block in shown.strip().split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if fields.get("ControlGroup"):
            found[fields["Id"]] = CGROUPS / fields["ControlGroup"].lstrip("/")
    return found


def running(cgroup: Path) -> bool:
    """Whether a process is in it: an ended worker keeps its unit (RemainAfterExit), emptied."""
    try:
        return bool((cgroup / "cgroup.procs").read_text().strip())
    except OSError:
        return False


def broker_unit(task_id: str) -> str:
    return f"box-broker@{task_id}.service"


def worker_unit(task_id: str) -> str:
    return f"box-task-{task_id}.service"


@dataclass
class TaskMemory:
    """memory.current of brokers and workers, one value per task and sample."""

    broker: list[int] = field(default_factory=list)
    worker: list[int] = field(default_factory=list)

    def sample(self, ids: list[str], groups: dict[str, Path], *, whole: bool = False) -> int:
        """Adds one value per task whose units both run (`whole`: only if all of them do);
        returns how many did."""
        brokers, workers = [], []
        for task_id in ids:
            broker = groups.get(broker_unit(task_id))
            worker = groups.get(worker_unit(task_id))
            if broker is None or worker is None:
                continue
            pair = cgroup_bytes(broker), cgroup_bytes(worker)
            if pair[0] is None or pair[1] is None or not running(worker):
                continue
            brokers.append(pair[0])
            workers.append(pair[1])
        if not whole or len(brokers) == len(ids):
            self.broker += brokers
            self.worker += workers
        return len(brokers)


class Sampler:
    """Samples the tasks' memory and the manager's use every SAMPLE_SECONDS, in a thread of its
    own, until stopped: the event loop and the tasks' timing do not wait for it."""

    def __init__(self, ids: list[str], groups: dict[str, Path]) -> None:
        self.ids, self.groups = ids, groups
        self.memory = TaskMemory()
        self.manager: list[ManagerUse] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            # Only while all run, so "running" is the figure of a box fully loaded.
            if self.memory.sample(self.ids, self.groups, whole=True) < len(self.ids):
                continue
            self.manager.append(ManagerUse.now(frozenset(self.ids)))

    @contextmanager
    def running(self) -> Iterator["Sampler"]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()


# --- the record ---------------------------------------------------------------------------------


def database() -> sqlite3.Connection:
    return sqlite3.connect(f"file:{DATABASE}?mode=ro", uri=True, timeout=30)


def states(ids: list[str]) -> dict[str, str]:
    marks = ",".join("?" * len(ids))
    with closing(database()) as db:
        rows = db.execute(f"SELECT id, state FROM tasks WHERE id IN ({marks})", ids).fetchall()
    return dict(rows)


def pending_approvals(ids: list[str]) -> list[str]:
    marks = ",".join("?" * len(ids))
    with closing(database()) as db:
        rows = db.execute(
            f"SELECT id FROM approvals WHERE state = 'pending' AND task IN ({marks})", ids
        ).fetchall()
    return [row[0] for row in rows]


@dataclass
class Logged:
    lines: list[int | None]
    results: list[tuple[str, bool]]
    error: str | None


def logged(task_id: str) -> Logged:
    with closing(database()) as db:
        events = db.execute(
            "SELECT kind, data FROM events WHERE task = ? AND kind IN ('task.step', "
            "'tool.result') ORDER BY seq",
            (task_id,),
        ).fetchall()
        record = db.execute("SELECT record FROM tasks WHERE id = ?", (task_id,)).fetchone()
    lines, results = [], []
    for kind, data in events:
        loaded = json.loads(data)
        if kind == "task.step":
            lines.append((loaded.get("data") or {}).get("line"))
        else:
            results.append((loaded.get("key"), bool(loaded.get("ok"))))
    return Logged(lines, results, json.loads(record[0]).get("error") if record else None)


def round_trips(ids: list[str]) -> dict[str, dict[str, list[float]]]:
    """What each task's worker printed at its end, by task id."""
    run("journalctl", "--sync")
    units = [option for task_id in ids for option in ("-u", worker_unit(task_id))]
    shown = run("journalctl", "-b", "-o", "json", "--output-fields=MESSAGE,_SYSTEMD_UNIT", *units)
    found: dict[str, dict[str, list[float]]] = {}
    for line in shown.splitlines():
        entry = json.loads(line)
        message = entry.get("MESSAGE")
        if isinstance(message, str) and message.startswith(ROUND_TRIPS):
            task_id = entry["_SYSTEMD_UNIT"].removeprefix("box-task-").removesuffix(".service")
            found[task_id] = json.loads(message.removeprefix(ROUND_TRIPS))
    return found


# --- the run ------------------------------------------------------------------------------------


async def wait_for(what: str, done: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not await asyncio.to_thread(done):
        if time.monotonic() > deadline:
            sys.exit(f"{what} did not happen within {seconds:g} s")
        await asyncio.sleep(POLL_SECONDS)


async def wait_for_cleared(ids: list[str], seconds: float) -> None:
    """Until the manager has cleared up after these ended tasks: their units gone, and last
    their network namespaces (boxd.manager.ending's `_leave`). Its descriptors are counted only
    then: the `ip netns delete` of the last tasks to end still holds a pipe of the manager's
    for a while after their units are gone (16 of them, once, in a run of 100)."""
    deadline = time.monotonic() + seconds
    while left := await asyncio.to_thread(left_of, ids):
        if time.monotonic() > deadline:
            sys.exit(f"ended tasks still not cleared up after {seconds:g} s: {left[:20]}")
        await asyncio.sleep(POLL_SECONDS)


def left_of(ids: list[str]) -> list[str]:
    """The units of these tasks that systemd still has loaded, and their network namespaces:
    none, once they ended and were cleared up."""
    listed = run("systemctl", "list-units", "--all", "--plain", "--no-legend", "box-*")
    units = [line.split()[0] for line in listed.splitlines() if any(t in line for t in ids)]
    return units + [str(path) for path in map(netns_path, ids) if path.exists()]


async def start_tasks(
    token: str, body: dict[str, Any], count: int, started: list[str]
) -> list[str]:
    """Starts `count` tasks, STARTING_AT_ONCE requests at a time; each is answered started
    (running, or already waiting on its `ask`). Their ids go to `started` as they come, so a
    run cut short can stop them."""
    headers = {"Authorization": f"Bearer {token}"}
    limit = asyncio.Semaphore(STARTING_AT_ONCE)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def one(number: int) -> str:
            async with (
                limit,
                http.post(
                    API, json={**body, "title": f"load {number}"}, headers=headers
                ) as response,
            ):
                task = await response.json()
            if response.status != 201:
                sys.exit(f"task {number} was refused: {response.status} {task}")
            started.append(task["id"])
            if task["state"] not in ("running", "waiting"):
                sys.exit(
                    f"task {number} ({task['id']}) was answered {task['state']}, not started: "
                    f"{task.get('error')}"
                )
            return str(task["id"])

        return list(await asyncio.gather(*(one(n) for n in range(count))))


def stop_unended(ids: list[str]) -> None:
    """Stops what a run cut short left running, so the next run (or test) has the box."""
    for task_id, state in states(ids).items():
        if state not in ENDED:
            subprocess.run([BOXCTL, "stop", task_id], capture_output=True, check=False)


async def answer_all(approvals: list[str]) -> None:
    limit = asyncio.Semaphore(STARTING_AT_ONCE)

    async def one(approval: str) -> None:
        async with limit:
            process = await asyncio.create_subprocess_exec(
                "busctl", "call", "org.boxd.Box1", "/org/boxd/Box1", "org.boxd.Box1.Manager",
                "AnswerApproval", "sb", approval, "true",
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            _, said = await process.communicate()
            if process.returncode != 0:
                sys.exit(f"approving {approval} failed: {said.decode(errors='replace')}")

    await asyncio.gather(*(one(approval) for approval in approvals))


def problems_of(
    ids: list[str], prompt: str, ended: dict[str, str], trips: dict[str, dict[str, list[float]]]
) -> list[str]:
    """What the checks found, in words; empty when nothing was lost."""
    steps = len(prompt.splitlines())
    calls = call_lines(prompt)
    found = []
    for task_id in ids:
        record = logged(task_id)
        if ended.get(task_id) != "done":
            found.append(f"{task_id} ended {ended.get(task_id)}: {record.error}")
        mine = trips.get(task_id)
        if mine is None:
            found.append(f"{task_id}: its worker printed no round trips (it did not finish)")
        elif (len(mine["step"]), len(mine["call"])) != (steps, len(calls)):
            found.append(
                f"{task_id}: its worker was answered for {len(mine['step'])} steps and "
                f"{len(mine['call'])} calls, not {steps} and {len(calls)}"
            )
        if record.lines != list(range(1, steps + 1)):
            missing = sorted(set(range(1, steps + 1)) - set(record.lines))
            twice = sorted({n for n in record.lines if n is not None and record.lines.count(n) > 1})
            found.append(
                f"{task_id}: the record's steps are not lines 1 to {steps} once each, in order: "
                f"missing {missing[:20]}, twice {twice[:20]}"
            )
        wanted = [(f"line-{n}", True) for n in calls]
        if sorted(record.results) != sorted(wanted):
            found.append(f"{task_id}: tool results {record.results[:20]}, wanted {wanted[:20]}")
    return found


async def measure(token: str, tasks: int, lines: int, calls: int) -> dict[str, Any]:
    settings = json.loads(run(BOXCTL, "settings", "--json"))
    workspace = f"load-{secrets.token_hex(3)}"
    run(BOXCTL, "workspace", "create", workspace)
    prompt = script(lines, calls)
    body = {"prompt": prompt, "worker": "fake", "tools": [TOOL], "workspace": workspace}
    # Room for all of them beside whatever else already runs in the box.
    room = min(settings["maxRunningTasks"] + tasks, MAX_RUNNING_TASKS)
    run(BOXCTL, "settings", "set", "maxRunningTasks", str(room))
    started: list[str] = []
    try:
        # One task first, so what the manager opens once (and keeps) is open before counting.
        warm = await start_tasks(
            token, {**body, "prompt": f'call {TOOL} {{"text": "w"}}'}, 1, started
        )
        await wait_for_cleared(warm, 120)
        before = ManagerUse.now()

        began = time.monotonic()
        ids = await start_tasks(token, body, tasks, started)
        start_seconds = time.monotonic() - began
        await wait_for(
            f"all {tasks} tasks waiting for the go-ahead",
            lambda: len(pending_approvals(ids)) == tasks,
            1200,
        )
        groups = unit_cgroups([u for t in ids for u in (broker_unit(t), worker_unit(t))])
        idle_memory = TaskMemory()
        idle_memory.sample(ids, groups)
        idle = ManagerUse.now(frozenset(ids))

        sampler = Sampler(ids, groups)
        with sampler.running():
            went = time.monotonic()
            await answer_all(pending_approvals(ids))
            await wait_for(
                "the end of every task",
                lambda: all(state in ENDED for state in states(ids).values()),
                3600,
            )
            run_seconds = time.monotonic() - went
        await wait_for_cleared(ids, 300)
        after = ManagerUse.now()
        ended = states(ids)
        trips = round_trips(ids)
        problems = problems_of(ids, prompt, ended, trips)
        if after.fds > before.fds + FD_SLACK:
            new = sorted((Counter(after.open_files) - Counter(before.open_files)).elements())
            problems.insert(
                0,
                f"the manager holds {after.fds} descriptors after the tasks, {before.fds} "
                f"before: more than {FD_SLACK} more ({new[:20]})",
            )
        return {
            "tasks": tasks,
            "steps": len(prompt.splitlines()),
            "calls": len(call_lines(prompt)),
            "start_seconds": start_seconds,
            "run_seconds": run_seconds,
            "ended": ended,
            "step": [s for one in trips.values() for s in one["step"]],
            "call": [s for one in trips.values() for s in one["call"]],
            "idle": {"broker": idle_memory.broker, "worker": idle_memory.worker},
            "running": {"broker": sampler.memory.broker, "worker": sampler.memory.worker},
            "manager": {
                "before": before.__dict__,
                "idle": idle.__dict__,
                "peak": {
                    key: max([getattr(use, key) for use in sampler.manager], default=0)
                    for key in ("rss", "cgroup", "fds", "web", "spares")
                },
                "after": after.__dict__,
            },
            "problems": problems,
        }
    finally:
        if started:
            stop_unended(started)
        run(BOXCTL, "settings", "set", "maxRunningTasks", str(settings["maxRunningTasks"]))


# --- the table ----------------------------------------------------------------------------------


def mib(value: float) -> str:
    return f"{value / 1024 / 1024:7.1f} MiB"


def table(result: dict[str, Any]) -> str:
    tasks, steps, calls = result["tasks"], result["steps"], result["calls"]
    run_seconds = result["run_seconds"]
    out = [
        f"{tasks} fake tasks at once, each {steps} steps (one a line, the go-ahead's "
        f"included) and {calls} calls of {TOOL}; {os.cpu_count()} CPUs",
        f"  started all {tasks} in {result['start_seconds']:.1f} s; from the go-ahead to the "
        f"last end {run_seconds:.1f} s: {tasks * steps / run_seconds:.0f} steps/s and "
        f"{tasks * calls / run_seconds:.0f} calls/s for the box",
        "",
        "latency, as the workers saw it         p50         p99         max       count",
    ]
    for kind in ("step", "call"):
        values = result[kind]
        if values:
            out.append(
                f"  POST /{kind:<31}{percentile(values, 0.5) * 1000:8.1f} ms "
                f"{percentile(values, 0.99) * 1000:8.1f} ms {max(values) * 1000:8.1f} ms "
                f"{len(values):11d}"
            )
    out += ["", f"memory of a task ({MEMORY_SOURCE})", " " * 38 + "mean         max     samples"]
    for when in ("idle", "running"):
        for part in ("broker", "worker"):
            values = result[when][part]
            if values:
                out.append(
                    f"  {when + ', ' + part:<30}{mib(sum(values) / len(values))} "
                    f"{mib(max(values))} {len(values):9d}"
                )
        both = [b + w for b, w in zip(result[when]["broker"], result[when]["worker"], strict=True)]
        if both:
            out.append(f"  {when + ', together':<30}{mib(sum(both) / len(both))} {mib(max(both))}")
    manager = result["manager"]
    out += [
        "",
        f"the manager ({MANAGER})             VmRSS     its cgroup       open fds     {WEB}"
        "      spares",
    ]
    for when, label in (
        ("before", "before (after a warm-up task)"),
        ("idle", f"{tasks} tasks idle"),
        ("peak", f"{tasks} tasks running, peak"),
        ("after", "after all ended"),
    ):
        use = manager[when]
        # 0: the cgroup's memory could not be read (no memory.current, no process's PSS).
        group = mib(use["cgroup"]) if use["cgroup"] else f"{'-':>11}"
        web = mib(use["web"]) if use["web"] else f"{'-':>11}"
        out.append(
            f"  {label:<30}{mib(use['rss'])}   {group}   {use['fds']:8d}     {web}"
            f"         {mib(use['spares'])}"
        )
    brokers = result["running"]["broker"]
    peak = manager["peak"]
    if brokers and peak["cgroup"] and peak["web"]:
        whole = sum(brokers) / len(brokers) * tasks + peak["cgroup"] + peak["web"] + peak["spares"]
        out += [
            "",
            f"boxd's own memory with {tasks} tasks running: {mib(whole).strip()} "
            f"({tasks} brokers at their mean; the manager's, the web's and the spares' cgroups "
            "at their peak; the tasks' workers are the agents')",
        ]
    done = sum(1 for state in result["ended"].values() if state == "done")
    out += ["", f"ended done: {done} of {tasks}; problems: {len(result['problems'])}"]
    out += [f"  {problem}" for problem in result["problems"][:50]]
    return "\n".join(out)


# --- the host side ------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--inside", metavar="TOKEN", help="measure here, with this token")
    parser.add_argument("--tasks", type=int, default=TASKS, help="tasks at once")
    parser.add_argument("--lines", type=int, default=LINES, help="script lines per task")
    parser.add_argument("--calls", type=int, default=CALLS, help="of them, calls of echo.say")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    arguments = parser.parse_args()
    if arguments.inside:
        result = asyncio.run(
            measure(arguments.inside, arguments.tasks, arguments.lines, arguments.calls)
        )
        print(json.dumps(result) if arguments.json else table(result))
        sys.exit(1 if result["problems"] else 0)
    # Here, not at the top: inside the machine this file runs alone, with no bench package.
    from bench.in_machine import run_in_machine

    sizes = ("--tasks", str(arguments.tasks), "--lines", str(arguments.lines))
    sys.exit(run_in_machine(__file__, (*sizes, "--calls", str(arguments.calls)), timeout=7200))


if __name__ == "__main__":
    main()
