"""How long from `POST /api/tasks` until the task's first step is durable, next to the floor:
a sandboxed `systemd-run --wait -p Type=exec -p User=... /bin/true` in the same machine and run.

Run as root from the repository: `make bench` (or `python -m bench.start_latency`). It boots a
test machine, installs this checkout, and runs the measurement inside it, where it prints p50
and p90 of both and their ratio. The two are interleaved, one of each in turn, so drift in the
machine's speed touches both alike.

Then where the time went, from the same POSTs: until the answer (the manager's part: the
task recorded, its user, view and namespace, its units' job queued), until systemd forked the
broker's and the worker's processes (ExecMainStartTimestamp), and until the worker's program
ran (its sandbox set up: Type=exec's ActiveEnterTimestamp). What follows the last of these,
up to the step, is the broker's and the worker's own start-up and the step itself. A task that
took a spare id has its broker forked before the POST (boxd/manager/spares.py): counted apart.
"""

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus

from boxd.dbus.bus_daemon import add_match

RUNS = 50
# The task's script: one step, then a moment for its units' timestamps to be read.
SCRIPT = "step first\nsleep 0.5"
SANDBOX = [
    "-p",
    "ProtectSystem=strict",
    "-p",
    "ProtectHome=yes",
    "-p",
    "PrivateTmp=yes",
    "-p",
    "NoNewPrivileges=yes",
]


def monotonic() -> float:
    """CLOCK_MONOTONIC, the clock of systemd's *TimestampMonotonic properties."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


async def started_at(bus: MessageBus, unit: str, name: str) -> float | None:
    """A unit's timestamp property (CLOCK_MONOTONIC, seconds), or None if it is not there."""
    found = await bus.call(
        Message(
            destination="org.freedesktop.systemd1",
            path="/org/freedesktop/systemd1",
            interface="org.freedesktop.systemd1.Manager",
            member="GetUnit",
            signature="s",
            body=[unit],
        )
    )
    if found is None or found.message_type != MessageType.METHOD_RETURN:
        return None
    interface = "Service" if name.startswith("ExecMain") else "Unit"
    value = await bus.call(
        Message(
            destination="org.freedesktop.systemd1",
            path=found.body[0],
            interface="org.freedesktop.DBus.Properties",
            member="Get",
            signature="ss",
            body=[f"org.freedesktop.systemd1.{interface}", name],
        )
    )
    if value is None or value.message_type != MessageType.METHOD_RETURN:
        return None
    micro: int = value.body[0].value
    return micro / 1e6 if micro else None


# Marks on the way to the first step: (unit, its timestamp property, what it says).
MARKS = {
    "answer": ("", "", "POST answered, the task running (the manager's part)"),
    "broker": ("box-broker@{}.service", "ExecMainStartTimestampMonotonic", "broker forked"),
    "worker": ("box-task-{}.service", "ExecMainStartTimestampMonotonic", "worker forked"),
    "sandboxed": (
        "box-task-{}.service",
        "ActiveEnterTimestampMonotonic",
        "worker's program running (its sandbox set up)",
    ),
}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


async def measure(token: str, runs: int) -> None:
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    first_step: dict[str, float] = {}
    ended: set[str] = set()
    news = asyncio.Event()

    def on_signal(message: Message) -> None:
        if message.message_type != MessageType.SIGNAL or message.member != "Event":
            return
        event = json.loads(message.body[2])
        if event["kind"] == "task.step":
            first_step.setdefault(event["task"], monotonic())
        elif event["kind"] == "task.state" and event["data"]["state"] in ("done", "failed"):
            ended.add(event["task"])
        news.set()

    bus.add_message_handler(on_signal)
    await add_match(
        bus,
        "type='signal',sender='org.boxd.Box1',interface='org.boxd.Box1.Task',"
        "member='Event',path_namespace='/org/boxd/Box1/task'",
    )

    async def until(condition: Callable[[], bool]) -> None:
        while not condition():
            news.clear()
            await asyncio.wait_for(news.wait(), 60)

    boxd: list[float] = []
    floor: list[float] = []
    # Where the time went: seconds from the POST to each mark, by mark.
    marks: dict[str, list[float]] = {name: [] for name in MARKS}
    # How many tasks had each mark before their POST: a spare's broker, started ahead.
    ahead: dict[str, int] = {name: 0 for name in MARKS}
    headers = {"Authorization": f"Bearer {token}"}
    body = {"title": "latency", "prompt": SCRIPT, "worker": "fake"}
    user = ""
    async with aiohttp.ClientSession() as http:
        for _ in range(runs):
            started = monotonic()
            async with http.post(
                "http://127.0.0.1:7700/api/tasks", json=body, headers=headers
            ) as response:
                task = await response.json()
            answered = monotonic()
            if response.status != 201 or task["state"] != "running":
                sys.exit(f"the task did not start: {task}")
            task_id: str = task["id"]
            await until(lambda: task_id in first_step)  # noqa: B023
            boxd.append(first_step[task_id] - started)
            marks["answer"].append(answered - started)
            for mark, (unit, name, _what) in MARKS.items():
                if unit:
                    at = await started_at(bus, unit.format(task_id), name)
                    if at is not None and at < started:
                        ahead[mark] += 1
                    elif at is not None:
                        marks[mark].append(at - started)
            await until(lambda: task_id in ended)  # noqa: B023
            user = task["user"]

            started = time.perf_counter()
            process = await asyncio.create_subprocess_exec(
                "systemd-run",
                "--quiet",
                "--wait",
                "-p",
                "Type=exec",
                "-p",
                f"User={user}",
                *SANDBOX,
                "/bin/true",
            )
            if await process.wait() != 0:
                sys.exit("systemd-run failed")
            floor.append(time.perf_counter() - started)
    bus.disconnect()

    def line(name: str, values: list[float]) -> str:
        return (
            f"{name:<58} p50 {percentile(values, 0.5) * 1000:7.1f} ms   "
            f"p90 {percentile(values, 0.9) * 1000:7.1f} ms"
        )

    print(f"start latency, {runs} tasks, one at a time, interleaved with the floor")
    print(line("POST /api/tasks -> first step durable (boxd)", boxd))
    print(line("systemd-run --wait -p Type=exec -p User=box-... /bin/true", floor))
    ratio = statistics.median(boxd) / statistics.median(floor)
    print(f"ratio of p50s (boxd / systemd-run): {ratio:.2f}")
    print("where the time went, from the POST:")
    for mark, values in marks.items():
        if values:
            print(line(f"  {MARKS[mark][2]}", values))
        if ahead[mark]:
            print(f"  {MARKS[mark][2]:<56} before the POST for {ahead[mark]} of {runs} tasks")


def run_in_machine(runs: int) -> None:
    from testbed.machine import Machine, install_boxd

    with Machine() as machine:
        install_boxd(machine)
        token = machine.run("boxctl", "token", "create", "--name", "bench").stdout.strip()
        shutil.copy(__file__, machine.root / "tmp" / "start_latency.py")
        done = machine.run(
            "/usr/lib/boxd/venv/bin/python",
            "/tmp/start_latency.py",
            "--inside",
            token,
            "--runs",
            str(runs),
            timeout=900,
        )
        print(done.stdout, end="")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--inside", metavar="TOKEN", help="measure here, with this token")
    parser.add_argument("--runs", type=int, default=RUNS)
    arguments = parser.parse_args()
    if arguments.inside:
        asyncio.run(measure(arguments.inside, arguments.runs))
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        run_in_machine(arguments.runs)


if __name__ == "__main__":
    main()
