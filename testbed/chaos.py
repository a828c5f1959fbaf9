"""Chaos rounds in a real box: fake tasks log steps, write files, pay through `wallet.pay` and
ask questions, a script plays the owner and answers, and at seeded random moments the manager,
a broker, a worker or the gateway is killed with SIGKILL, or the power is cut (the machine
killed at once and booted again from the same disks). After every round, `check` holds the box
to what it promises (see `Check`). tests/vm/test_chaos.py runs one short round; bench/chaos.py
runs many and prints their figures.

Every round prints its seed; `BOXD_CHAOS_SEED=<seed>` replays it (the kills fall on the same
draws, though not on the same instants of the tasks: the box's own timing varies).

What a power cut here is: every process of the machine dies at once and nothing is shut down;
the disks are the host's, so what the machine wrote and did not fsync is still in the host's page
cache. A cut that also loses unsynced writes needs a disk of its own (dm-flakey or the like).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.box_api import http
from testbed.machine import Machine

SEED_VARIABLE = "BOXD_CHAOS_SEED"
WALLET = ["wallet.pay", "wallet.balance"]
BUDGET_CENTS = 50
WORKSPACES = ("chaos-a", "chaos-b", "chaos-c")
ACKS_DIR = ".chaos-acks"
# What may be killed, and how often in a hundred draws: a killed worker ends its task failed by
# design (a worker's exit is its task's end), so it is drawn less often than the others.
COMPONENTS = {"manager": 30, "broker": 30, "gateway": 15, "worker": 8, "power": 17}
# How long the box may take to end every task of a round after the last kill.
SETTLE_SECONDS = 240.0
# The owner looks at what waits this often.
OWNER_POLL_SECONDS = 0.3
PYTHON = "/usr/lib/boxd/venv/bin/python"
# How long an ended task's units, mounts and sockets may take to go.
LEFTOVER_SECONDS = 60.0
RUNNING_STATES = ("active", "activating", "deactivating", "reloading")
# What the fake worker logs for a denied call or question.
NOT_APPROVED = ("not approved", "wallet.pay failed: not approved")
# answeredBy of an approval that the task's end closed.
TASK_ENDED = "task ended"
BOX = "/var/lib/box"


def round_seed() -> int:
    given = os.environ.get(SEED_VARIABLE)
    if given is not None:
        if not given.isdigit():
            raise SystemExit(f"{SEED_VARIABLE} must be a whole number, not {given!r}")
        return int(given)
    return random.SystemRandom().randrange(2**32)


# --- the tasks ----------------------------------------------------------------------------------


@dataclass
class Planned:
    """One task of a round, as the round started it."""

    number: int
    tag: str
    workspace: str
    script: str
    # path -> text, the last `write` of each path
    files: dict[str, str]
    id: str = ""

    @property
    def acks(self) -> str:
        return f"{ACKS_DIR}/{self.tag}.jsonl"


def plan_task(rng: random.Random, seed: int, number: int) -> Planned:
    tag = f"{seed}-{number}"
    workspace = rng.choice(WORKSPACES)
    files: dict[str, str] = {}
    lines = [f"acks {ACKS_DIR}/{tag}.jsonl", f"step task {number} of round {seed} begins"]
    for part in range(rng.randint(6, 10)):
        kind = rng.choice(("step", "write", "pay", "pay", "ask", "sleep", "sh"))
        if kind == "step":
            lines.append(f"step part {part}: {rng.choice(('plan', 'read', 'think', 'sum'))}")
        elif kind == "write":
            path = f"f-{tag}-{part}.txt"
            files[path] = f"word-{rng.randrange(10**6)}"
            lines.append(f"write {path} {files[path]}")
        elif kind == "pay":
            cents = rng.randint(5, 35)
            pay = {"to": f"payee-{tag}-{part}", "cents": cents, "memo": f"part {part}"}
            lines.append(f"call wallet.pay {json.dumps(pay)}")
        elif kind == "ask":
            lines.append(f"ask may task {tag} go on with part {part}?")
        elif kind == "sleep":
            lines.append(f"sleep {rng.choice(('0.5', '1', '2'))}")
        else:
            lines.append("sh cat /proc/self/status | grep -c Cap")
    lines.append(f"step task {number} ends")
    return Planned(number, tag, workspace, "\n".join(lines), files)


def ensure_workspaces(machine: Machine, token: str) -> None:
    _, listed = http(machine, "GET", "/api/workspaces", token)
    items = listed if isinstance(listed, list) else listed.get("workspaces", [])
    names = {w["name"] if isinstance(w, dict) else w for w in items}
    for name in WORKSPACES:
        if name not in names:
            status, made = http(
                machine, "POST", "/api/workspaces", token, json.dumps({"name": name})
            )
            assert status in (200, 201), made


def start_tasks(machine: Machine, token: str, planned: list[Planned]) -> None:
    for task in planned:
        body = {
            "title": f"chaos {task.tag}",
            "prompt": task.script,
            "worker": "fake",
            "workspace": task.workspace,
            "tools": WALLET,
            "budgetCents": BUDGET_CENTS,
        }
        status, started = http(machine, "POST", "/api/tasks", token, json.dumps(body))
        assert status == 201, started
        task.id = started["id"]


# --- the owner ----------------------------------------------------------------------------------


class Owner(threading.Thread):
    """Answers what waits, over HTTP, as the owner would: approves or denies each approval by a
    draw of its own (seed and approval id), and writes down every answer the box took."""

    def __init__(self, machine: Machine, token: str, seed: int) -> None:
        super().__init__(daemon=True, name="chaos-owner")
        self.machine = machine
        self.token = token
        self.seed = seed
        self.answered: dict[str, bool] = {}
        # Answered once by us, and then the box said it was already answered: fine if it holds
        # our first answer (our 200 was lost with the gateway).
        self.already: dict[str, str] = {}
        # Every answer sent, also those whose reply was lost (the gateway killed meanwhile).
        self.sent: set[str] = set()
        self.errors = 0
        self._finished = threading.Event()
        # Set while the machine is off or booting: no requests then.
        self.paused = threading.Event()

    def decision(self, approval_id: str) -> bool:
        return random.Random(f"{self.seed}:{approval_id}").random() < 0.7

    def stop(self) -> None:
        self._finished.set()
        self.join(timeout=30)

    def run(self) -> None:
        while not self._finished.wait(OWNER_POLL_SECONDS):
            if self.paused.is_set():
                continue
            try:
                self._answer_waiting()
            except Exception:
                self.errors += 1

    def _answer_waiting(self) -> None:
        status, listed = http(self.machine, "GET", "/api/approvals", self.token)
        if status != 200 or not isinstance(listed, list):
            self.errors += 1
            return
        for approval in listed:
            wanted = self.decision(approval["id"])
            self.sent.add(approval["id"])
            status, answer = http(
                self.machine,
                "POST",
                f"/api/approvals/{approval['id']}",
                self.token,
                json.dumps({"approved": wanted}),
            )
            if status == 200:
                self.answered[approval["id"]] = wanted
            elif status == 400 and "already answered" in str(answer):
                self.already[approval["id"]] = str(answer)
            else:
                self.errors += 1


# --- chaos --------------------------------------------------------------------------------------


@dataclass
class Figures:
    rounds: int = 0
    tasks: int = 0
    done: int = 0
    failed: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    power_cuts: int = 0
    steps_acknowledged: int = 0
    steps_found: int = 0
    calls: int = 0
    bookings: int = 0
    approvals: int = 0
    resumes: int = 0
    # power back on -> boxd answers; -> every task cut off runs again (or has ended)
    answer_seconds: list[float] = field(default_factory=list)
    resume_seconds: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # why tasks failed, in their own words
    failures: Counter[str] = field(default_factory=Counter)


def _active_units(machine: Machine, pattern: str) -> list[str]:
    listed = machine.run(
        "systemctl", "list-units", "--plain", "--no-legend", "--state=active", pattern, timeout=30
    ).stdout
    return sorted(line.split()[0] for line in listed.splitlines() if line.strip())


def _task_of(unit: str) -> str:
    return unit.split("@", 1)[-1].removeprefix("box-task-").split(".", 1)[0]


def wait_for_boxd(machine: Machine, token: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if http(machine, "GET", "/api/tasks", token)[0] == 200:
                return
        except Exception:
            pass
        time.sleep(0.05)
    raise AssertionError(f"boxd did not answer within {timeout:g} s after the power came back")


def power_cut(machine: Machine, token: str, owner: Owner, figures: Figures, ours: set[str]) -> None:
    """Kills the machine, boots it from the same disks, and times the way back."""
    running = {_task_of(u) for u in _active_units(machine, "box-task-*")} & ours
    owner.paused.set()
    try:
        machine.kill()
        started = time.monotonic()
        machine.start()
        wait_for_boxd(machine, token)
        figures.answer_seconds.append(time.monotonic() - started)
    finally:
        owner.paused.clear()
    deadline = time.monotonic() + 120
    left = set(running)
    while left and time.monotonic() < deadline:
        back = {_task_of(u) for u in _active_units(machine, "box-task-*")}
        ended = {t for t in left if _state(machine, token, t) in ("done", "failed")}
        left -= back | ended
        if left:
            time.sleep(0.05)
    if left:
        figures.problems.append(f"after a power cut, tasks {sorted(left)} did not run again")
    else:
        figures.resume_seconds.append(time.monotonic() - started)
    figures.resumes += len(running)


def _state(machine: Machine, token: str, task_id: str) -> str:
    status, task = http(machine, "GET", f"/api/tasks/{task_id}", token)
    return str(task.get("state")) if status == 200 and isinstance(task, dict) else "?"


def draw(rng: random.Random) -> str:
    return rng.choices(list(COMPONENTS), weights=list(COMPONENTS.values()))[0]


def strike(
    machine: Machine,
    token: str,
    component: str,
    rng: random.Random,
    owner: Owner,
    figures: Figures,
    ours: set[str],
) -> str:
    """One kill of `component`; returns what it hit, for the round's story."""
    if component == "power":
        power_cut(machine, token, owner, figures, ours)
        figures.power_cuts += 1
        return "power"
    unit = {"manager": "boxd.service", "gateway": "boxd-web.service"}.get(component)
    if unit is None:
        pattern = "box-broker@*.service" if component == "broker" else "box-task-*.service"
        candidates = [u for u in _active_units(machine, pattern) if _task_of(u) in ours]
        if not candidates:
            return f"{component} (none running)"
        unit = rng.choice(candidates)
    machine.run("systemctl", "kill", "--signal=KILL", unit, check=False, timeout=30)
    figures.kills[component] += 1
    return f"{component} {unit}"


def run_round(
    machine: Machine,
    token: str,
    seed: int,
    tasks: int,
    strikes: int,
    figures: Figures,
    *,
    must_strike: tuple[str, ...] = (),
) -> None:
    """One round: `tasks` tasks, `strikes` kills at random moments (`must_strike` first, in a
    drawn order), then the checks. Problems go to figures.problems, each naming the seed."""
    print(f"chaos round: seed {seed} ({SEED_VARIABLE}={seed} replays it)", flush=True)
    rng = random.Random(seed)
    ensure_workspaces(machine, token)
    planned = [plan_task(rng, seed, n) for n in range(tasks)]
    owner = Owner(machine, token, seed)
    owner.start()
    story: list[str] = []
    try:
        start_tasks(machine, token, planned)
        ours = {p.id for p in planned}
        # The forced ones in a drawn order, a power cut last: the others need tasks running.
        forced = [c for c in must_strike if c != "power"]
        rng.shuffle(forced)
        forced += [c for c in must_strike if c == "power"]
        for number in range(max(strikes, len(forced))):
            time.sleep(rng.uniform(0.3, 2.5))
            component = forced[number] if number < len(forced) else draw(rng)
            story.append(strike(machine, token, component, rng, owner, figures, ours))
        print(f"  strikes: {'; '.join(story)}", flush=True)
        settling = time.monotonic()
        wait_until_ended(machine, token, planned)
        print(f"  all ended {time.monotonic() - settling:.1f} s after the last strike", flush=True)
    finally:
        owner.stop()
    problems = check(machine, planned, owner, figures) + wait_for_no_leftovers(machine, planned)
    print(
        f"  the owner answered {len(owner.answered)} approvals "
        f"({len(owner.already)} already answered, {owner.errors} requests failed)",
        flush=True,
    )
    for problem in problems:
        print(f"  PROBLEM: {problem}", flush=True)
    figures.rounds += 1
    figures.tasks += len(planned)
    figures.problems += [f"seed {seed}: {p}" for p in problems]


def wait_until_ended(machine: Machine, token: str, planned: list[Planned]) -> None:
    """Returns once every task has ended, or SETTLE_SECONDS have passed (`check` says which)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    left = {p.id for p in planned}
    while left and time.monotonic() < deadline:
        for task_id in sorted(left):
            try:
                if _state(machine, token, task_id) in ("done", "failed"):
                    left.discard(task_id)
            except Exception:  # the gateway may be coming back
                pass
        if left:
            time.sleep(0.2)


# --- the checks ---------------------------------------------------------------------------------

DUMP = Path(__file__).with_name("chaos_dump.py")


def dump(machine: Machine, ids: list[str]) -> dict[str, Any]:
    done = machine.run(PYTHON, "-c", DUMP.read_text(), input=json.dumps(ids), timeout=60)
    loaded: dict[str, Any] = json.loads(done.stdout)
    return loaded


def layer_name(number: int) -> str:
    from boxd.manager.workspaces.layers import layer_name as name

    return name(number)


@dataclass
class Seen:
    """One task as the record shows it after a round."""

    task: Planned
    record: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    layer: tuple[str, int, int] | None

    @property
    def where(self) -> str:
        return f"task {self.task.id} ({self.task.tag})"

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [d for k, d in self.events if k == "task.step" and isinstance(d.get("data"), dict)]

    def heard(self, line: int) -> list[str]:
        return [s["text"] for s in self.steps if s["data"].get("line") == line]


def check(
    machine: Machine,
    planned: list[Planned],
    owner: Owner,
    figures: Figures,
) -> list[str]:
    """What the box promises after a round, as a list of what broke it (empty: all held)."""
    problems: list[str] = []
    state = dump(machine, [p.id for p in planned])
    events_of: dict[str, list[tuple[str, dict[str, Any]]]] = {p.id: [] for p in planned}
    for task_id, kind, data in state["events"]:
        events_of[task_id].append((kind, data))
    layers = {task: (ws, number, active) for ws, number, task, active in state["layers"]}
    bookings: dict[str, dict[str, list[Any]]] = {}
    for task_id, key, payee, cents in state["bookings"]:
        bookings.setdefault(task_id, {}).setdefault(key, []).append([payee, cents])
    approvals = [a for a in state["approvals"]]
    figures.approvals += len(approvals)
    for task in planned:
        record = state["tasks"].get(task.id)
        if record is None:
            problems.append(f"task {task.id} ({task.tag}) is not in the record")
            continue
        seen = Seen(task, record, events_of[task.id], layers.get(task.id))
        if record["state"] not in ("done", "failed"):
            problems.append(_stuck(machine, seen, approvals))
            continue
        if record["state"] == "failed":
            figures.failed += 1
            error = record.get("error")
            figures.failures[str(error)[:160]] += 1
            if not isinstance(error, str) or not error.strip() or "Traceback" in error:
                problems.append(f"{seen.where} failed without plain words: {error!r}")
        else:
            figures.done += 1
        problems += _steps_once(seen)
        problems += _calls_and_bookings(seen, bookings.get(task.id, {}), figures)
        own = [a for a in approvals if a["task"] == task.id]
        problems += _approvals(seen, own, owner)
        problems += _layers(machine, seen, layers, state["tasks"], figures)
    return problems


def _stuck(machine: Machine, seen: Seen, approvals: list[dict[str, Any]]) -> str:
    asked = [(a["id"], a["state"]) for a in approvals if a["task"] == seen.task.id]
    story = machine.run(
        "sh", "-c", f"journalctl -b --no-pager | grep {seen.task.id} | tail -n 25", check=False
    ).stdout
    return (
        f"{seen.where} is stuck {seen.record['state']} (last step {seen.record.get('step')!r}) "
        f"{SETTLE_SECONDS:g} s after the last kill; its approvals {asked}; its journal:\n{story}"
    )


def _steps_once(seen: Seen) -> list[str]:
    """No line logged twice; a done task logged every line of its script."""
    problems = []
    lines = Counter(s["data"].get("line") for s in seen.steps)
    twice = sorted(line for line, count in lines.items() if count > 1)
    if twice:
        problems.append(f"{seen.where} logged lines {twice} more than once")
    script = [n for n, line in enumerate(seen.task.script.splitlines(), 1) if line.strip()]
    missing = [n for n in script if n not in lines]
    if seen.record["state"] == "done" and missing:
        problems.append(f"{seen.where} is done and never logged lines {missing}")
    return problems


def _calls_and_bookings(seen: Seen, booked: dict[str, list[Any]], figures: Figures) -> list[str]:
    """One tool.call and at most one tool.result per key, a result for every call of a done
    task, and the wallet's ledger and the log telling the same payments."""
    problems = []
    calls = {d["key"] for k, d in seen.events if k == "tool.call"}
    results: dict[str, list[dict[str, Any]]] = {}
    for kind, data in seen.events:
        if kind == "tool.result":
            results.setdefault(data["key"], []).append(data)
    figures.calls += len(calls)
    figures.bookings += sum(len(v) for v in booked.values())
    for key, found in results.items():
        if len(found) > 1:
            problems.append(f"{seen.where} logged {len(found)} tool.results for key {key}")
    if seen.record["state"] == "done":
        for key in sorted(calls - set(results)):
            problems.append(f"{seen.where} began call {key} and logged no tool.result for it")
    for key, rows in booked.items():
        if len(rows) > 1:
            problems.append(f"{seen.where}: the wallet booked key {key} {len(rows)} times")
        if not any(r.get("ok") for r in results.get(key, [])):
            problems.append(
                f"{seen.where}: the wallet booked {key} {rows} and no tool.result says so"
            )
    for key, found in results.items():
        for result in found:
            if not (result.get("ok") and result.get("tool") == "wallet.pay"):
                continue
            output = result.get("output")
            if key not in booked:
                problems.append(f"{seen.where}: tool.result {key} paid; the ledger has no booking")
            elif (
                isinstance(output, dict)
                and [[output.get("to"), output.get("cents")]] != booked[key]
            ):
                problems.append(
                    f"{seen.where}: tool.result {key} says {output}; the ledger {booked[key]}"
                )
    return problems


def _approvals(seen: Seen, approvals: list[dict[str, Any]], owner: Owner) -> list[str]:
    """Each answered once, as the owner answered it (or closed by the task's end), and the task
    heard that answer."""
    problems = []
    answers = Counter(
        d["id"] for k, d in seen.events if k == "approval" and "by" in d and "state" in d
    )
    problems += [
        f"{seen.where}: approval {i} was answered {count} times"
        for i, count in answers.items()
        if count > 1
    ]
    for approval in approvals:
        approval_id, state = approval["id"], approval["state"]
        if state == "pending":
            problems.append(f"{seen.where}: approval {approval_id} is still pending at the end")
            continue
        by = approval.get("answeredBy")
        wanted = "approved" if owner.decision(approval_id) else "denied"
        if approval_id in owner.answered and state != wanted:
            problems.append(
                f"{seen.where}: the owner answered {approval_id} {wanted} and got 200; "
                f"the record says {state} by {by!r}"
            )
        ended = by == TASK_ENDED
        heard_by_owner = approval_id in owner.sent
        if not ended and not heard_by_owner:
            problems.append(
                f"{seen.where}: approval {approval_id} is {state} by {by!r}; the owner never "
                "answered it"
            )
        elif not ended and state != wanted:
            problems.append(
                f"{seen.where}: approval {approval_id} is {state}; the owner said {wanted}"
            )
        key = approval_id.split(".", 1)[1]
        heard = seen.heard(int(key.removeprefix("line-"))) if key.startswith("line-") else []
        said_no = bool(heard) and heard[0] in NOT_APPROVED
        if heard and said_no != (state == "denied"):
            problems.append(
                f"{seen.where}: approval {approval_id} is {state}; the task heard {heard}"
            )
    return problems


def _layers(
    machine: Machine,
    seen: Seen,
    layers: dict[str, tuple[str, int, int]],
    records: dict[str, dict[str, Any]],
    figures: Figures,
) -> list[str]:
    """A done task's layer is in its workspace's stack with the files it wrote and every step
    it was told was logged; a failed task has none; `saw` names done tasks below it."""
    problems = []
    for earlier in seen.record.get("saw", []):
        shown = records.get(earlier, {}).get("state", "done")
        if shown != "done":
            problems.append(f"{seen.where} saw {earlier}, which is {shown}")
    if seen.record["state"] != "done":
        if seen.layer is not None:
            problems.append(f"{seen.where} failed and has a layer: {seen.layer}")
        return problems
    if seen.layer is None or not seen.layer[2] or seen.layer[0] != seen.task.workspace:
        return [*problems, f"{seen.where} is done; its layer row is {seen.layer}"]
    number = seen.layer[1]
    folder = machine.home / "layers" / seen.task.workspace / layer_name(number)
    for path, text in seen.task.files.items():
        found = (folder / path).read_text() if (folder / path).is_file() else None
        if found != text:
            problems.append(f"{seen.where}: its layer holds {found!r} in {path}, not {text!r}")
    acks = folder / seen.task.acks
    acked = [json.loads(line) for line in acks.read_text().splitlines()] if acks.is_file() else []
    if not acked:
        problems.append(f"{seen.where}: no acknowledged steps in its layer")
    logged = {(s["data"].get("line"), s["text"]) for s in seen.steps}
    lost = [a for a in acked if (a["line"], a["text"]) not in logged]
    figures.steps_acknowledged += len(acked)
    figures.steps_found += len(acked) - len(lost)
    if lost:
        problems.append(f"{seen.where}: steps acknowledged and not in the log: {lost}")
    for earlier in seen.record.get("saw", []):
        below = layers.get(earlier)
        if below is not None and (below[0] != seen.task.workspace or below[1] >= number):
            problems.append(f"{seen.where} saw {earlier}, whose layer {below} is not below its own")
    return problems


def leftovers(machine: Machine, planned: list[Planned]) -> list[str]:
    """What of the ended tasks is still mounted, running, listening or has a network."""
    state = dump(machine, [p.id for p in planned])
    problems = []
    for task in planned:
        if state["tasks"].get(task.id, {}).get("state") not in ("done", "failed"):
            continue
        for name, text in (
            ("mounted", state["mounts"]),
            ("listening", state["listening"]),
            ("in /run/netns", state["netns"]),
        ):
            shown = [line for line in text.splitlines() if task.id in line]
            if shown:
                problems.append(f"task {task.id} has ended and is still {name}: {shown[:3]}")
        for line in state["units"].splitlines():
            words = line.split()
            if task.id in line and len(words) > 2 and words[2] in RUNNING_STATES:
                problems.append(f"task {task.id} has ended and its unit runs: {line.strip()}")
    return problems


def wait_for_no_leftovers(machine: Machine, planned: list[Planned]) -> list[str]:
    """An ended task's units stop after its end is recorded: they get LEFTOVER_SECONDS."""
    deadline = time.monotonic() + LEFTOVER_SECONDS
    while True:
        found = leftovers(machine, planned)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def table(figures: Figures) -> str:
    def spread(values: list[float]) -> str:
        if not values:
            return "-"
        ordered = sorted(values)
        return f"p50 {ordered[len(ordered) // 2]:.2f} s, max {ordered[-1]:.2f} s"

    rows = [
        ("rounds", str(figures.rounds)),
        ("tasks (done / failed)", f"{figures.tasks} ({figures.done} / {figures.failed})"),
        *((f"kill -9 {name}", str(figures.kills[name])) for name in COMPONENTS if name != "power"),
        ("power cuts", str(figures.power_cuts)),
        (
            "steps acknowledged / found in the log",
            f"{figures.steps_acknowledged} / {figures.steps_found}",
        ),
        ("calls / wallet bookings", f"{figures.calls} / {figures.bookings}"),
        ("approvals", str(figures.approvals)),
        ("tasks cut off by a power cut, resumed", str(figures.resumes)),
        ("power on -> boxd answers", spread(figures.answer_seconds)),
        ("power on -> cut-off tasks run again", spread(figures.resume_seconds)),
        ("problems", str(len(figures.problems))),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)
