"""Load, small enough for CI: 20 fake tasks at once, each 50 steps and 5 calls (bench/load.py,
the same run at a smaller size). Correctness only, no timing: every step and call a worker was
answered for is in the record, every task ends done, and the manager holds no more file
descriptors after the tasks than before, give or take a few (a leak of one a task shows)."""

import json

from bench import load
from bench.in_machine import run_script
from testbed.box_api import API, boxctl, finish, start_fake, wait_for_step
from testbed.machine import Machine

TASKS, LINES, CALLS = 20, 50, 5


def test_twenty_tasks_at_once_lose_nothing_and_leak_no_descriptor(
    machine: Machine, token: str
) -> None:
    sizes = ("--tasks", str(TASKS), "--lines", str(LINES), "--calls", str(CALLS))
    done = run_script(machine, load.__file__, token, (*sizes, "--json"), timeout=600)
    assert done.stdout.strip(), done.stderr
    result = json.loads(done.stdout)
    steps = LINES + 1  # every line logs a step, the go-ahead's `ask` included
    assert (result["steps"], result["calls"]) == (steps, CALLS)
    assert list(result["ended"].values()) == ["done"] * TASKS, result["problems"]
    # Every answered request was timed by its worker: these are the acknowledged ones.
    assert (len(result["step"]), len(result["call"])) == (TASKS * steps, TASKS * CALLS)
    assert result["problems"] == []
    manager = result["manager"]
    assert manager["after"]["fds"] <= manager["before"]["fds"] + load.FD_SLACK, manager
    assert done.returncode == 0, done.stderr


def test_an_ended_task_leaves_no_unit_loaded(machine: Machine, token: str) -> None:
    """systemd keeps a slice active until it is stopped: every ended task left its
    box-<id>.slice behind, a unit more in systemd for good with each task (found by the load)."""
    done = start_fake(machine, token, "step done")
    stopped = start_fake(machine, token, "sleep 60")
    wait_for_step(machine, done["id"])
    boxctl(machine, "stop", stopped["id"])
    assert finish(machine, done["id"])["state"] == "done"
    # The end is recorded before the broker's units are stopped: wait for them, for a while.
    script = (
        "import subprocess, sys, time\n"
        "deadline = time.monotonic() + 30\n"
        "while True:\n"
        "    listed = subprocess.run(['systemctl', 'list-units', '--all', '--plain',"
        " '--no-legend', *sys.argv[1:]], capture_output=True, text=True, check=True).stdout\n"
        "    if not listed.strip() or time.monotonic() > deadline:\n"
        "        print(listed, end='')\n"
        "        break\n"
        "    time.sleep(0.1)\n"
    )
    patterns = [f"*{task['id']}*" for task in (done, stopped)]
    left = machine.run("/usr/lib/boxd/venv/bin/python", "-c", script, *patterns, timeout=60).stdout
    assert [line.split()[0] for line in left.splitlines()] == []


def test_tasks_created_at_once_are_each_answered_started(machine: Machine, token: str) -> None:
    """A request's admission starts every queued task that has a place, others' among them:
    under load, requests that came at once were answered `queued` for tasks another request was
    still starting (found by the load). Each is answered with its task started."""
    limit = json.loads(boxctl(machine, "settings", "--json").stdout)["maxRunningTasks"]
    boxctl(machine, "settings", "set", "maxRunningTasks", "64")
    body = json.dumps({"title": "at once", "prompt": "sleep 60", "worker": "fake"})
    post = (
        f"curl -sS -H 'Authorization: Bearer {token}' -H 'Content-Type: application/json' "
        f"--data-binary '{body}' {API}/api/tasks"
    )
    try:
        answers = machine.run(
            "sh",
            "-c",
            f'd=$(mktemp -d); for i in $(seq 8); do {post} > "$d/$i" & done; wait; '
            'for f in "$d"/*; do cat "$f"; echo; done; rm -r "$d"',
        ).stdout
        tasks = [json.loads(line) for line in answers.splitlines() if line.strip()]
        for task in tasks:
            boxctl(machine, "stop", task["id"])
    finally:
        boxctl(machine, "settings", "set", "maxRunningTasks", str(limit))
    assert [task["state"] for task in tasks] == ["running"] * 8, tasks
