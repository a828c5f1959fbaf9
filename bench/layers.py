"""What a deep stack of layers costs: file lookups through a task's view at 1, 100 and 499 lower
layers, and `boxctl undo` of a layer in the middle of a deep stack.

Run as root from the repository: `.venv/bin/python -m bench.layers`. It boots a
test machine, installs this checkout, copies itself in and does the rest inside the machine:

1. Three workspaces, each with a 4 KiB `base.txt` in its base folder, filled with 0, 99 and 498
   done fake tasks (eight at a time over the HTTP API; each writes one small file), so their
   stacks have 1, 100 and 499 lower layers counting the base. Filling takes about 5 minutes.
   Now and then a task fails (boxd could not mount its view: "failed to clone lowerpath" in the
   kernel log; or its unit stopped "from outside boxd"); it is started again in its place, and
   counted.
2. One `sleep 600` task on each. On each task's mounted view
   (`/var/lib/box/tasks/<id>/work`), as root: open+read of `base.txt` (the bottom of the stack)
   and `os.stat` of a missing path, N times each, p50 and the ratio to the 1-layer figure. The
   dentry cache is never dropped: these are warm-cache figures. For comparison, also the same
   on the base folder without overlayfs, and a stat of a new missing name each time (no cached
   dentry for it: a lookup in every layer).
   Then `boxctl stop` of the three.
3. `boxctl undo` wall-clock of the done tasks at 250, 251 and 252 from the bottom of the
   498-deep stack, next to `boxctl show` of the same task (the command's own start-up and call).
4. Keeping a personal-folder task that changed 1,000 files: a folder of 1,000 files of 1 KiB
   belonging to a user `benchowner`, in Settings agentFolders; a fake task rewrites all of them;
   then `POST /api/tasks/{id}/keep` wall-clock, three times (each a new task on the kept
   folder). Next to it, the floor: writing the same 1,000 files into a fresh folder from Python,
   each written whole, fsync'ed and renamed into place, as keep does.
"""

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

API = "http://127.0.0.1:7700"
BOX_HOME = Path("/var/lib/box")
RUNS = 2000
WARMUP = 200
CHUNK = 200
# Done tasks below the measured task, and so lower layers with the base: 1, 100, 499.
DEPTHS = {"layers-1": 0, "layers-100": 99, "layers-499": 498}
DEEPEST = "layers-499"
UNDO_AT = (250, 251, 252)
BASE_SIZE = 4096
PARALLEL = 8
TASK_SECONDS = 180
FILL_SECONDS = 1200
START_TRIES = 3


def say(line: str) -> None:
    print(line, flush=True)


class Box:
    """The box's HTTP API, with a token."""

    def __init__(self, http: aiohttp.ClientSession) -> None:
        self.http = http
        # Tasks that failed (boxd could not mount their view, say), started again.
        self.failed: list[str] = []

    async def call(self, method: str, path: str, body: Any = None, status: int = 200) -> Any:
        async with self.http.request(method, f"{API}{path}", json=body) as answer:
            found = await answer.json()
            if answer.status != status:
                sys.exit(f"{method} {path} answered {answer.status}: {found}")
            return found

    async def start(self, workspace: str, title: str, prompt: str) -> dict[str, Any]:
        body = {"title": title, "worker": "fake", "workspace": workspace, "prompt": prompt}
        task: dict[str, Any] = await self.call("POST", "/api/tasks", body, status=201)
        return task

    async def until(self, task: dict[str, Any], states: tuple[str, ...]) -> dict[str, Any]:
        deadline = time.monotonic() + TASK_SECONDS
        while task["state"] not in states:
            if time.monotonic() > deadline:
                sys.exit(f"task {task['id']} is still {task['state']} after {TASK_SECONDS} s")
            await asyncio.sleep(0.2)
            task = await self.call("GET", f"/api/tasks/{task['id']}")
        return task

    async def run(
        self, workspace: str, title: str, prompt: str, states: tuple[str, ...]
    ) -> dict[str, Any]:
        """Starts a task and waits until it is in one of `states` or failed. A task that failed
        (boxd could not mount its view, say) is started again in its place, up to START_TRIES
        times, and noted."""
        for _ in range(START_TRIES):
            task = await self.until(await self.start(workspace, title, prompt), (*states, "failed"))
            if task["state"] != "failed":
                return task
            self.failed.append(task["id"])
            error = str(task.get("error", "")).splitlines()[0]
            say(f"  NOTE: task {task['id']} ({title}) failed, started again: {error}")
        sys.exit(f"{title} on {workspace} failed {START_TRIES} times over")


async def fill(box: Box, workspace: str, count: int) -> None:
    """Starts `count` tasks on the workspace, eight at a time, each writing one small file, and
    waits until all are done."""
    if count == 0:
        return
    gate = asyncio.Semaphore(PARALLEL)
    started = time.monotonic()
    finished = 0

    async def one(number: int) -> dict[str, Any]:
        nonlocal finished
        async with gate:
            prompt = f"write n{number}.txt {number}"
            task = await box.run(workspace, f"layer {number}", prompt, ("done",))
        finished += 1
        if finished % 50 == 0 or finished == count:
            say(
                f"  {workspace}: {finished}/{count} tasks ended, {time.monotonic() - started:.0f} s"
            )
        return task

    ended = await asyncio.wait_for(asyncio.gather(*(one(n) for n in range(count))), FILL_SECONDS)
    failed = [task for task in ended if task["state"] != "done"]
    if failed:
        for task in failed[:5]:
            say(f"  task {task['id']} ({task['title']}) is {task['state']}: {task.get('error')}")
        sys.exit(f"{workspace}: {len(failed)} of {count} tasks are not done")


def percentile(values: list[int], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def open_read(path: str) -> Callable[[int], None]:
    def op(_: int) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.read(fd, 2 * BASE_SIZE)
        finally:
            os.close(fd)

    return op


def stat_missing(path: str) -> Callable[[int], None]:
    def op(_: int) -> None:
        try:
            os.stat(path)
        except FileNotFoundError:
            return
        sys.exit(f"{path} exists")

    return op


def stat_new_missing(folder: str, tag: str) -> Callable[[int], None]:
    def op(number: int) -> None:
        path = f"{folder}/missing-{tag}-{number}"
        try:
            os.stat(path)
        except FileNotFoundError:
            return
        sys.exit(f"{path} exists")

    return op


def timed(ops: dict[str, Callable[[int], None]], runs: int) -> dict[str, list[int]]:
    """Each op `runs` times after a warm-up, in chunks taken in turn so that drift in the
    machine's speed touches every op alike. Nanoseconds per call."""
    samples: dict[str, list[int]] = {name: [] for name in ops}
    clock = time.perf_counter_ns
    for op in ops.values():
        for number in range(-WARMUP, 0):
            op(number)
    done = 0
    while done < runs:
        size = min(CHUNK, runs - done)
        for name, op in ops.items():
            record = samples[name]
            for number in range(done, done + size):
                began = clock()
                op(number)
                record.append(clock() - began)
        done += size
    return samples


def measure(views: dict[str, Path], runs: int) -> None:
    """views: row label -> the folder to measure in; the row labelled "1" is the reference."""
    kinds = ("open+read base.txt", "stat missing", "stat new missing name")
    ops: dict[str, Callable[[int], None]] = {}
    for label, folder in views.items():
        tag = label.split(",")[0]
        ops[f"{label}|{kinds[0]}"] = open_read(f"{folder}/base.txt")
        ops[f"{label}|{kinds[1]}"] = stat_missing(f"{folder}/no-such-file")
        ops[f"{label}|{kinds[2]}"] = stat_new_missing(str(folder), tag)
    samples = timed(ops, runs)
    p50 = {name: percentile(values, 0.5) / 1000 for name, values in samples.items()}
    reference = "1"
    say("")
    say(
        f"lookups through a task's view, N={runs} each after {WARMUP} unmeasured, p50 in µs; "
        f"ratio to the 1-layer view"
    )
    say(
        "warm cache: the same paths again and again, the dentry cache never dropped; 'stat new "
        "missing name' asks for a new name each time, which no layer has cached"
    )
    header = f"{'lower layers':<22}"
    for kind in kinds:
        header += f" {kind:>22} {'ratio':>6}"
    say(header)
    for label in views:
        row = f"{label:<22}"
        for kind in kinds:
            value = p50[f"{label}|{kind}"]
            ratio = value / p50[f"{reference}|{kind}"]
            row += f" {value:>22.2f} {ratio:>6.2f}"
        say(row)


def lower_layers(view: Path) -> int | None:
    """How many lower layers the overlay on `view` has, from its mount options."""
    with open("/proc/self/mountinfo") as table:
        for line in table:
            fields = line.split()
            if fields[4].encode().decode("unicode_escape") != str(view):
                continue
            options = fields[fields.index("-") + 3].split(",")
            count = 0
            for option in options:
                if option.startswith("lowerdir="):
                    count += len(option.split(":"))
                elif option.startswith("lowerdir+="):
                    count += 1
            return count
    return None


def boxctl(*args: str) -> float:
    """Runs boxctl; returns its wall-clock time in seconds."""
    began = time.perf_counter()
    done = subprocess.run(["boxctl", *args], capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - began
    if done.returncode != 0:
        sys.exit(f"boxctl {' '.join(args)} failed: {done.stdout}{done.stderr}")
    return elapsed


KEEP_FILES = 1000
KEEP_RUNS = 3
KEEP_FOLDER = Path("/srv/bench/keep")


def write_files(folder: Path, text: bytes) -> float:
    """The floor for keep: each file written whole, fsync'ed and renamed into place."""
    began = time.perf_counter()
    for number in range(KEEP_FILES):
        temporary = folder / f".f{number}.tmp"
        with temporary.open("wb") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        temporary.rename(folder / f"f{number}.txt")
    return time.perf_counter() - began


def prepare_keep() -> None:
    """A folder of 1 KiB files that belongs to someone other than root, in agentFolders."""
    subprocess.run(["useradd", "--system", "benchowner"], capture_output=True, timeout=60)
    KEEP_FOLDER.mkdir(parents=True, exist_ok=True)
    for number in range(KEEP_FILES):
        (KEEP_FOLDER / f"f{number}.txt").write_bytes(b"o" * 1024)
    subprocess.run(["chown", "-R", "benchowner:", str(KEEP_FOLDER.parent)], check=True)
    boxctl("settings", "set", "agentFolders", f'["{KEEP_FOLDER.parent}"]')


def floor_writes() -> list[float]:
    folder = Path("/srv/bench/floor")
    folder.mkdir(exist_ok=True)
    return [write_files(folder, b"f" * 1024) for _ in range(KEEP_RUNS)]


async def measure_keep(box: Box) -> None:
    say(f"4. keep of a personal-folder task that rewrote {KEEP_FILES} files")
    await asyncio.to_thread(prepare_keep)
    kept: list[float] = []
    for run in range(KEEP_RUNS):
        script = f"sh for i in $(seq 0 {KEEP_FILES - 1}); do printf %01024d {run} > f$i.txt; done"
        task = await box.call(
            "POST",
            "/api/tasks",
            {"title": "rewrite", "worker": "fake", "prompt": script, "folder": str(KEEP_FOLDER)},
            status=201,
        )
        task = await box.until(task, ("done", "failed"))
        if task["state"] != "done":
            sys.exit(f"task {task['id']} is {task['state']}: {task.get('error')}")
        began = time.perf_counter()
        task = await box.call("POST", f"/api/tasks/{task['id']}/keep")
        kept.append(time.perf_counter() - began)
        if task.get("review") != "kept":
            sys.exit(f"task {task['id']} was not kept: {task.get('error')}")
        sample = (KEEP_FOLDER / "f7.txt").read_text()
        if sample != f"{run:01024d}":
            sys.exit(f"f7.txt holds {sample[:20]!r}... after keep, not the task's text")
        say(f"  run {run + 1}: keep took {kept[-1] * 1000:.0f} ms")
    floor = await asyncio.to_thread(floor_writes)
    median, median_floor = statistics.median(kept), statistics.median(floor)
    say(
        f"  median: keep {median * 1000:.0f} ms ({median / KEEP_FILES * 1e6:.0f} us a file), "
        f"floor {median_floor * 1000:.0f} ms, ratio {median / median_floor:.2f}"
    )
    boxctl("settings", "set", "agentFolders", "[]")


async def inside(token: str, runs: int) -> None:
    began = time.monotonic()
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        box = Box(http)

        say("1. workspaces, each with a 4 KiB base.txt in its base folder")
        for name in DEPTHS:
            await box.call("POST", "/api/workspaces", {"name": name}, status=201)
            base = BOX_HOME / "workspaces" / name / "base.txt"
            base.write_bytes(b"x" * BASE_SIZE)
            base.chmod(0o664)
        for name, count in DEPTHS.items():
            say(f"  filling {name} with {count} done tasks, {PARALLEL} at a time")
            await fill(box, name, count)
        say(f"  filled in {time.monotonic() - began:.0f} s")

        say("2. one `sleep 600` task on each workspace")
        sleepers: dict[str, dict[str, Any]] = {}
        for name, count in DEPTHS.items():
            task = await box.run(name, "held open", "sleep 600", ("running",))
            if task["state"] != "running":
                sys.exit(f"task {task['id']} is {task['state']}: {task.get('error')}")
            if len(task["saw"]) != count:
                sys.exit(f"task {task['id']} saw {len(task['saw'])} done tasks, not {count}")
            view = BOX_HOME / "tasks" / task["id"] / "work"
            deadline = time.monotonic() + 30
            while not await asyncio.to_thread(os.path.ismount, view):
                if time.monotonic() > deadline:
                    sys.exit(f"{view} is not mounted")
                await asyncio.sleep(0.1)
            sleepers[name] = task
        for name, count in DEPTHS.items():
            view = BOX_HOME / "tasks" / sleepers[name]["id"] / "work"
            found = lower_layers(view)
            say(f"  {name}: task {sleepers[name]['id']} running, {found} lower layers mounted")
            if found != count + 1:
                say(f"  NOTE: {found} lower layers, not {count + 1}")
        views = {"base, no overlay": BOX_HOME / "workspaces" / DEEPEST}
        for name, count in DEPTHS.items():
            views[str(count + 1)] = BOX_HOME / "tasks" / sleepers[name]["id"] / "work"
        measure(views, runs)
        for task in sleepers.values():
            boxctl("stop", task["id"])
            await box.until(task, ("failed",))
        say("  the three tasks stopped")

        # The stack, bottom first: the deepest sleeper saw every done task, newest first.
        stack = list(reversed(sleepers[DEEPEST]["saw"]))
        say("")
        say(f"3. boxctl undo of a done task deep in {DEEPEST} ({len(stack)} done layers)")
        undo: list[float] = []
        floor: list[float] = []
        for position in UNDO_AT:
            task_id = stack[position - 1]
            floor.append(boxctl("show", task_id))
            undo.append(boxctl("undo", task_id))
            ended = await box.call("GET", f"/api/tasks/{task_id}")
            if ended["state"] != "undone":
                sys.exit(f"task {task_id} is {ended['state']} after boxctl undo")
            say(
                f"  layer {position} of the original stack (task {task_id}): "
                f"boxctl undo {undo[-1] * 1000:.0f} ms, boxctl show {floor[-1] * 1000:.0f} ms"
            )
        say(
            f"  median: boxctl undo {statistics.median(undo) * 1000:.0f} ms, "
            f"boxctl show (start-up and one call) {statistics.median(floor) * 1000:.0f} ms"
        )
        say("")
        await measure_keep(box)
    say(
        f"tasks that failed and were started again in their place: "
        f"{len(box.failed)}{': ' + ' '.join(box.failed) if box.failed else ''}"
    )
    say(f"inside the machine: {time.monotonic() - began:.0f} s")


def run_in_machine(runs: int) -> None:
    from testbed.machine import Machine, install_boxd

    began = time.monotonic()
    with Machine() as machine:
        install_boxd(machine)
        token = machine.run("boxctl", "token", "create", "--name", "bench").stdout.strip()
        (machine.root / "tmp" / "layers_bench.py").write_bytes(Path(__file__).read_bytes())
        say(f"machine booted and boxd installed in {time.monotonic() - began:.0f} s")
        # Its output comes straight through, so the progress lines show as they come.
        process = machine.spawn(
            "/usr/lib/boxd/venv/bin/python",
            "/tmp/layers_bench.py",
            "--inside",
            token,
            "--runs",
            str(runs),
            stdout=None,
            stderr=None,
        )
        try:
            status = process.wait(timeout=2400)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
            sys.exit("the measurement did not finish within 40 minutes")
        if status != 0:
            sys.exit(f"the measurement failed with status {status}")
    say(f"all told, with booting and stopping the machine: {time.monotonic() - began:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--inside", metavar="TOKEN", help="measure here, with this token")
    parser.add_argument("--runs", type=int, default=RUNS)
    arguments = parser.parse_args()
    if arguments.inside:
        asyncio.run(inside(arguments.inside, arguments.runs))
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        run_in_machine(arguments.runs)


if __name__ == "__main__":
    main()
