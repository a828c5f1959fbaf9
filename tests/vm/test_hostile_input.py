"""Issue 9, points 2 and 12, played as the attacker: numbers that are not numbers, fields past
their caps, records boxd cannot read, answers too long for one D-Bus message, and control
characters meant for the owner's terminal."""

import json
import re
import time
from typing import Any

from testbed.box_api import BOXCTL, boxctl, busctl_call, finish, http, start_fake, wait_for_step
from testbed.machine import Machine

PYTHON = "/usr/lib/boxd/venv/bin/python"
DB = "/var/lib/box/box.db"
DAMAGED = (
    "The record of this task in box.db was damaged and could not be read, so boxd "
    "stopped it and marked it failed."
)
MB = 1024 * 1024


def broker(
    machine: Machine, task: dict[str, Any], method: str, path: str, body: str | None = None
) -> tuple[int, Any]:
    """A request to the task's broker, made as the task's own user, as its worker would."""
    sock = f"/var/lib/box/tasks/{task['id']}/broker.sock"
    argv = ["curl", "-sS", "-X", method, "-w", "\n%{http_code}", "--unix-socket", sock]
    if body is not None:
        argv += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    done = machine.run(*argv, f"http://box{path}", user=task["user"], input=body, timeout=120)
    text, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(text) if text else None


def restart_and_list(machine: Machine, token: str) -> list[dict[str, Any]]:
    """boxd comes back, and every list answers."""
    machine.run("systemctl", "restart", "boxd.service", timeout=180)
    assert machine.run("systemctl", "is-active", "boxd.service").stdout.strip() == "active"
    status, tasks = http(machine, "GET", "/api/tasks", token)
    assert status == 200, tasks
    assert http(machine, "GET", "/api/approvals", token)[0] == 200
    boxctl(machine, "list")
    boxctl(machine, "approvals")
    assert isinstance(tasks, list)
    return tasks


def counted(machine: Machine, shell: str, user: str | None = None) -> dict[str, Any]:
    """Runs `shell`, whose output is one long JSON answer, and reads its shape inside the machine
    (a hundred megabytes need not cross into the test)."""
    reader = (
        "import json, sys\n"
        "raw = sys.stdin.buffer.read()\n"
        "value = json.loads(raw)\n"
        "items = value if isinstance(value, list) else value.get('steps', value.get('tasks'))\n"
        "print(json.dumps({'bytes': len(raw), 'items': len(items),"
        " 'keys': sorted(value) if isinstance(value, dict) else None}))\n"
    )
    script = f"set -o pipefail; {shell} | {PYTHON} -c {_quote(reader)}"
    done = machine.run("bash", "-c", script, user=user, timeout=600)
    return dict(json.loads(done.stdout))


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def sql(machine: Machine, script: str, *args: str) -> str:
    """Python's sqlite3 on the box's database, as someone who can write the file would."""
    program = f"import json, sqlite3, sys\ndb = sqlite3.connect({DB!r})\n{script}\ndb.commit()\n"
    return machine.run(PYTHON, "-c", program, *args, timeout=300).stdout


def test_numbers_that_are_not_numbers_are_refused_and_the_box_stays_up(
    machine: Machine, token: str
) -> None:
    task = start_fake(machine, token, "step up\nsleep 300", tools=["echo.say"])
    wait_for_step(machine, task["id"])
    huge = "1" + "0" * 400
    cases = [
        ("/cost", '{"cents": 1e999, "what": "x"}', "cents: 1e999 is not a finite number"),
        ("/cost", '{"cents": -1e999, "what": "x"}', "cents: -1e999 is not a finite number"),
        ("/cost", '{"cents": NaN, "what": "x"}', "cents: NaN is not a number"),
        ("/cost", '{"cents": Infinity, "what": "x"}', "cents: Infinity is not a number"),
        ("/cost", '{"cents": -Infinity, "what": "x"}', "cents: -Infinity is not a number"),
        ("/cost", f'{{"cents": {huge}, "what": "x"}}', "cents: 1000000000...(401 digits) is out"),
        (
            "/cost",
            '{"cents": 1e300, "what": "x"}',
            "cents must be a number of US cents from 0 to 1,000,000,000",
        ),
        (
            "/usage",
            f'{{"model": "claude-sonnet-4-6", "tokens": {{"input": {huge}, "output": 1}}}}',
            "tokens.input: 1000000000...(401 digits) is out of range",
        ),
        (
            "/usage",
            '{"model": "claude-sonnet-4-6", "tokens": {"input": 9000000000000, "output": 1}}',
            "tokens.input: input should be less than or equal to 1000000000",
        ),
        ("/step", '{"text": "a", "data": {"x": [NaN]}}', "data.x.0: NaN is not a number"),
        (
            "/call",
            '{"tool": "echo.say", "key": "k1", "input": {"text": Infinity}}',
            "input.text: Infinity is not a number",
        ),
        (
            "/ask",
            '{"question": "q", "key": "k2", "costCents": 1e999}',
            "costCents: 1e999 is not a finite number",
        ),
        ("/step", json.dumps({"text": "x" * (5 * MB)}), "text is over 20,000 characters"),
        (
            "/step",
            json.dumps({"text": "a", "data": "x" * (5 * MB)}),
            "data is over 1 MB as JSON",
        ),
        ("/cost", json.dumps({"cents": 1, "what": "w" * (5 * MB)}), "what is over 200 characters"),
        (
            "/ask",
            json.dumps({"question": "q", "key": "k3", "payee": "p" * (5 * MB)}),
            "payee is over 200 characters",
        ),
        (
            "/call",
            json.dumps({"tool": "echo.say", "key": "k4", "input": {"text": "x" * (5 * MB)}}),
            "input is over 1 MB as JSON",
        ),
    ]
    for path, body, words in cases:
        status, answer = broker(machine, task, "POST", path, body)
        assert (status, answer["error"][: len(words)]) == (400, words), (path, body[:80], answer)
    status, answer = broker(machine, task, "POST", "/step", json.dumps({"text": "x" * (11 * MB)}))
    assert (status, answer) == (413, {"error": "the body is over 10 MB"})

    # The HTTP gateway and D-Bus read the same way.
    start = '{"title": "t", "prompt": "step x", "worker": "fake", "budgetCents": 1e999}'
    assert http(machine, "POST", "/api/tasks", token, start) == (
        400,
        {"error": "budgetCents: 1e999 is not a finite number"},
    )
    answer_nan = http(
        machine, "POST", f"/api/approvals/{task['id']}.k2", token, '{"approved": NaN}'
    )
    assert answer_nan == (400, {"error": "approved: NaN is not a number"})
    settings = busctl_call(machine, "SetSettings", '{"taskTasksMax": 1e999}', check=False)
    assert settings.returncode != 0
    assert "taskTasksMax: 1e999 is not a finite number" in settings.stderr

    # Nothing of it was recorded; every list answers, before and after a restart.
    tasks = restart_and_list(machine, token)
    mine = next(t for t in tasks if t["id"] == task["id"])
    assert mine["costCents"] == 0 and mine["state"] == "running"
    boxctl(machine, "stop", task["id"])


def test_a_damaged_record_fails_its_task_and_nothing_else(machine: Machine, token: str) -> None:
    good = start_fake(machine, token, "step fine")
    assert finish(machine, good["id"])["state"] == "done"
    victim = start_fake(machine, token, "step up\nsleep 600", title="the victim")
    wait_for_step(machine, victim["id"])
    # What `POST /cost {"cents": 1e999}` left on main (an infinity written as null), and a row
    # that is not JSON at all; written while boxd runs, as anyone who can write the file could.
    sql(
        machine,
        "db.execute(\"UPDATE tasks SET record = json_set(record, '$.costCents', json('null')) "
        'WHERE id = ?", (sys.argv[1],))\n'
        "db.execute(\"INSERT INTO tasks VALUES ('tdamaged01', 0, 'done', 'not json')\")",
        victim["id"],
    )
    tasks = {t["id"]: t for t in restart_and_list(machine, token)}
    assert tasks[good["id"]]["state"] == "done"
    for damaged in (victim["id"], "tdamaged01"):
        assert tasks[damaged]["state"] == "failed", tasks[damaged]
        assert tasks[damaged]["error"] == DAMAGED
    assert tasks[victim["id"]]["title"] == "the victim"
    shown = json.loads(boxctl(machine, "show", victim["id"], "--json").stdout)
    assert shown["state"] == "failed" and [s["text"] for s in shown["steps"]] == ["up"]
    # Its worker was stopped, and the journal says which task was damaged.
    unit = f"box-task-{victim['id']}.service"
    assert machine.run("systemctl", "is-active", unit, check=False).stdout.strip() != "active"
    journal = machine.run("journalctl", "-u", "boxd.service", "--no-pager", "-o", "cat").stdout
    assert f"task {victim['id']} is damaged" in journal
    assert "task tdamaged01 is damaged" in journal
    # Recorded failed: the next start reads it as it is, with nothing left to mend.
    restart_and_list(machine, token)
    sql(machine, "db.execute(\"DELETE FROM tasks WHERE id = 'tdamaged01'\")")


def test_a_hundred_megabytes_of_steps_still_answer(machine: Machine, token: str) -> None:
    task = start_fake(machine, token, "step up\nsleep 600")
    wait_for_step(machine, task["id"])
    sock = f"/var/lib/box/tasks/{task['id']}/broker.sock"
    # Steps at their cap, 1 MB of data each, logged by the task through its broker.
    poster = (
        "set -e\n"
        f"{PYTHON} -c \"import json; print(json.dumps({{'text': 'big', 'data': "
        "{'blob': 'x' * 1000000}}))\" > /tmp/step-$$.json\n"
        "for i in $(seq 100); do\n"
        f"  curl -sS -o /dev/null -w '%{{http_code}}\\n' --unix-socket {sock} "
        "--data-binary @/tmp/step-$$.json http://box/step\n"
        "done | sort | uniq -c\n"
        "rm /tmp/step-$$.json\n"
    )
    logged = machine.run("bash", "-c", poster, user=task["user"], timeout=900).stdout.split()
    assert logged == ["100", "200"], logged
    # One page over D-Bus is a part of it, with the cursor of the next.
    first = json.loads(
        json.loads(busctl_call(machine, "GetTask", task["id"], "").stdout)["data"][0]
    )
    assert 1 < len(first["steps"]) < 101 and first["next"]
    auth = f"-H 'Authorization: Bearer {token}'"
    url = f"http://127.0.0.1:7700/api/tasks/{task['id']}"
    over_http = counted(machine, f"curl -sS -f {auth} {url}")
    assert over_http["items"] == 101 and over_http["bytes"] > 100_000_000
    assert "steps" in over_http["keys"] and "title" in over_http["keys"]
    over_boxctl = counted(machine, f"{BOXCTL} show {task['id']} --json")
    assert over_boxctl["items"] == 101
    from_the_task = counted(
        machine, f"curl -sS -f --unix-socket {sock} http://box/task", user=task["user"]
    )
    assert from_the_task["items"] == 101 and from_the_task["keys"] == ["steps", "task"]
    boxctl(machine, "stop", task["id"])
    assert len(boxctl(machine, "show", task["id"]).stdout) > 100


def test_ten_thousand_tasks_and_approvals_still_answer(machine: Machine, token: str) -> None:
    model = start_fake(machine, token, "step model")
    assert finish(machine, model["id"])["state"] == "done"
    # The questions are a running task's: questions pending for a task that ended are what a
    # manager cut off before it cleared that task leaves, and boxd clears them when it starts.
    waiting = start_fake(machine, token, "step up\nsleep 600")
    wait_for_step(machine, waiting["id"])
    # 10,000 tasks and as many questions, each long and far from ASCII, so that on the wire
    # (where every "é" is \u00e9) the lists are well over dbus-daemon's 32 MiB message limit.
    filler = (
        "import time\n"
        "record = json.loads(db.execute('SELECT record FROM tasks WHERE id = ?',"
        " (sys.argv[1],)).fetchone()[0])\n"
        "now = time.time()\n"
        "for n in range(10000):\n"
        "    task_id = f'tmany{n:05d}'\n"
        "    row = dict(record, id=task_id, user='box-' + task_id, prompt='\u00e9' * 1000,"
        " title=f'many {n}', createdAt=now - 10000 + n)\n"
        "    db.execute('INSERT INTO tasks VALUES (?, ?, ?, ?)',"
        " (task_id, row['createdAt'], 'done', json.dumps(row)))\n"
        "    approval = {'id': f'{sys.argv[2]}.q{n:05d}', 'task': sys.argv[2], 'key': f'q{n:05d}',"
        " 'state': 'pending', 'question': '\u00e9' * 1000, 'askedAt': now}\n"
        "    db.execute('INSERT INTO approvals VALUES (?, ?, ?, ?)',"
        " (approval['id'], sys.argv[2], 'pending', json.dumps(approval)))\n"
    )
    sql(machine, filler, model["id"], waiting["id"])
    try:
        restart_and_list(machine, token)
        listed = json.loads(json.loads(busctl_call(machine, "ListTasks", "").stdout)["data"][0])
        assert 0 < len(listed["tasks"]) < 10_000 and listed["next"]
        auth = f"-H 'Authorization: Bearer {token}'"
        tasks = counted(machine, f"curl -sS -f {auth} http://127.0.0.1:7700/api/tasks")
        assert tasks["items"] >= 10_001 and tasks["bytes"] > 60_000_000
        approvals = counted(machine, f"curl -sS -f {auth} http://127.0.0.1:7700/api/approvals")
        assert approvals["items"] >= 10_000 and approvals["bytes"] > 60_000_000
        assert counted(machine, f"{BOXCTL} list --json")["items"] >= 10_001
        lines = machine.run("bash", "-c", f"set -o pipefail; {BOXCTL} approvals | wc -l")
        assert int(lines.stdout) >= 10_000
    finally:
        sql(
            machine,
            "db.execute('DELETE FROM approvals WHERE task = ?', (sys.argv[1],))\n"
            "db.execute(\"DELETE FROM tasks WHERE id LIKE 'tmany%'\")",
            waiting["id"],
        )
        machine.run("systemctl", "restart", "boxd.service", timeout=180)
        boxctl(machine, "stop", waiting["id"])


RAW = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def test_the_owners_terminal_sees_escapes_not_controls(machine: Machine, token: str) -> None:
    ask = json.dumps({"question": "pay \u001b[2J now?\rforged", "key": "k"})
    prompt = (
        "sh printf 'seen \\033[2J\\033]0;pwned\\007 then\\rover\\n  00:00:00  -> done'\n"
        f"sh curl -sS --unix-socket $BOX_SOCKET -d '{ask}' http://box/ask"
    )
    task = start_fake(machine, token, prompt, title="evil \u001b[2J title\r")
    wait_for_step(machine, task["id"])
    deadline = time.monotonic() + 60
    while "pay" not in (waiting := boxctl(machine, "approvals").stdout):
        assert time.monotonic() < deadline, "the task asked nothing"
        time.sleep(0.2)
    assert "pay \\x1b[2J now?\\rforged" in waiting
    listed = boxctl(machine, "list").stdout
    assert "evil \\x1b[2J title\\r" in listed
    boxctl(machine, "stop", task["id"])
    shown = boxctl(machine, "show", task["id"]).stdout
    followed = boxctl(machine, "follow", task["id"], check=False).stdout
    for out in (waiting, listed, shown, followed):
        assert not RAW.search(out), repr(out)
    for out in (shown, followed):
        assert "seen \\x1b[2J\\x1b]0;pwned\\x07 then\\rover" in out
        # The task's "line" is shown as the rest of its step, never as one of boxd's own.
        lines = out.splitlines()
        forged = next(line for line in lines if "-> done" in line)
        assert forged.lstrip().startswith("| "), lines
    assert "evil \\x1b[2J title\\r" in shown
