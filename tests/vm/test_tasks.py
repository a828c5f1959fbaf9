"""A task end to end through the real systemd, bus, polkit and users of a booted machine."""

import json

from testbed.box_api import (
    boxctl,
    busctl_call,
    busctl_result,
    finish,
    http,
    start_fake,
    wait_for_step,
)
from testbed.machine import Machine


def test_http_task_runs_as_its_own_user_and_ends_done(machine: Machine, token: str) -> None:
    task = start_fake(machine, token, "step hello\nsh id -un\nwrite out.txt hi there")
    assert task["state"] == "running"
    assert task["user"] == f"box-{task['id']}"
    assert task["worker"] == "fake"
    assert task["workspace"] == "home"
    assert task["budgetCents"] == 100
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert [(s["text"], s["data"]) for s in ended["steps"]] == [
        ("hello", {"line": 1}),
        (f"box-{task['id']}", {"line": 2}),
        ("wrote out.txt", {"line": 3}),
    ]
    assert ended["step"] == "wrote out.txt"
    status, over_http = http(machine, "GET", f"/api/tasks/{task['id']}", token)
    assert status == 200
    assert over_http["state"] == "done"
    assert [s["text"] for s in over_http["steps"]] == [
        "hello",
        f"box-{task['id']}",
        "wrote out.txt",
    ]
    # Its changes joined the workspace: the next task sees them.
    after = start_fake(machine, token, "sh cat out.txt; echo; stat -c '%U %G %a' out.txt")
    assert after["saw"][0] == task["id"]
    seen = finish(machine, after["id"])
    assert seen["steps"][0]["text"] == f"hi there\n{task['user']} boxd-work 664"
    status, listed = http(machine, "GET", "/api/tasks", token)
    assert status == 200
    assert task["id"] in [t["id"] for t in listed]


def test_dbus_task_with_busctl(machine: Machine) -> None:
    request = {"title": "over D-Bus", "prompt": "step from busctl\nsh id -un", "worker": "fake"}
    task = busctl_result(busctl_call(machine, "CreateTask", json.dumps(request)))
    assert task["state"] == "running"
    ended = finish(machine, task["id"])
    assert ended["state"] == "done"
    assert [s["text"] for s in ended["steps"]] == ["from busctl", f"box-{task['id']}"]
    state = machine.run(
        "busctl",
        "get-property",
        "org.boxd.Box1",
        f"/org/boxd/Box1/task/{task['id']}",
        "org.boxd.Box1.Task",
        "State",
    )
    assert state.stdout.strip() == 's "done"'
    tree = machine.run("busctl", "tree", "--list", "org.boxd.Box1").stdout.split()
    assert f"/org/boxd/Box1/task/{task['id']}" in tree


def test_boxctl_start_follow_and_list(machine: Machine) -> None:
    started = boxctl(
        machine,
        "start",
        "--worker",
        "fake",
        "--title",
        "from boxctl",
        "--follow",
        "step one\nstep two",
    )
    lines = started.stdout.splitlines()
    task_id = lines[0]
    assert lines[1].endswith("one") and lines[2].endswith("two")
    assert lines[-1].endswith("-> done")
    listed = json.loads(boxctl(machine, "list", "--json").stdout)
    assert listed[0]["id"] == task_id
    assert task_id in boxctl(machine, "list").stdout


def test_stop_a_running_task(machine: Machine, token: str) -> None:
    task = start_fake(machine, token, "step started\nsleep 60\nstep never")
    wait_for_step(machine, task["id"])
    status, stopped = http(machine, "POST", f"/api/tasks/{task['id']}/stop", token)
    assert status == 200
    assert stopped["state"] == "failed"
    assert stopped["error"] == "Stopped by its owner."
    unit = f"box-task-{task['id']}.service"
    assert machine.run("systemctl", "is-active", unit, check=False).stdout.strip() != "active"
    status, again = http(machine, "POST", f"/api/tasks/{task['id']}/stop", token)
    assert status == 400
    assert again == {"error": f"task {task['id']} has already ended: it is failed"}


def test_a_failing_script_says_why(machine: Machine, token: str) -> None:
    task = start_fake(machine, token, "step a\nfail the printer is on fire")
    ended = finish(machine, task["id"])
    assert ended["state"] == "failed"
    assert ended["error"] == "The worker exited with status 1: line 2: the printer is on fire"


def test_a_droid_task_fails_saying_droid_could_not_be_installed(
    machine: Machine, token: str
) -> None:
    # A test machine has no network and no registry stand-in unless a test starts one
    # (testbed/npm_registry.py): the install boxd started at boot fails at once.
    status, task = http(
        machine,
        "POST",
        "/api/tasks",
        token,
        json.dumps({"title": "droid", "prompt": "write a poem"}),
    )
    assert status == 201
    assert task["worker"] == "droid"
    assert task["model"] == "claude-sonnet-4-6"
    assert task["droid"] == {"plan": False, "autonomy": "low"}
    ended = finish(machine, task["id"])
    assert ended["state"] == "failed"
    assert ended["error"].startswith("Droid could not be installed: https://registry.npmjs.org/")
    assert ended["error"].endswith(
        "boxd tries again the next time it starts (systemctl restart boxd)."
    )


def test_worker_killed_with_sigkill_fails_in_plain_words(machine: Machine, token: str) -> None:
    task = start_fake(machine, token, "step up\nsleep 60")
    wait_for_step(machine, task["id"])
    machine.run("systemctl", "kill", "--signal=KILL", f"box-task-{task['id']}.service")
    ended = finish(machine, task["id"])
    assert ended["state"] == "failed"
    assert ended["error"] == "The worker was killed by SIGKILL."


def test_journal_tells_the_story(machine: Machine, token: str) -> None:
    task = start_fake(machine, token, "step the story begins", title="storyteller")
    finish(machine, task["id"])
    machine.run("journalctl", "--sync")
    story = machine.run("journalctl", f"BOX_TASK={task['id']}", "-o", "cat").stdout.splitlines()
    assert story == [
        f"Task {task['id']} is queued: storyteller",
        f"Task {task['id']} is running",
        f"Task {task['id']} step: the story begins",
        f"Task {task['id']} is done",
    ]
    steps = machine.run("journalctl", f"BOX_TASK={task['id']}", "BOX_EVENT=task.step", "-o", "cat")
    assert steps.stdout.splitlines() == [f"Task {task['id']} step: the story begins"]


def test_unit_properties(machine: Machine, token: str) -> None:
    task = start_fake(machine, token, "step up\nsleep 60")
    wait_for_step(machine, task["id"])
    unit = f"box-task-{task['id']}.service"
    shown = machine.run(
        "systemctl",
        "show",
        unit,
        "-p",
        "Type,User,Slice,ProtectSystem,ProtectHome,PrivateTmp,"
        "NoNewPrivileges,Environment,ActiveState,SubState",
    ).stdout
    properties = dict(line.split("=", 1) for line in shown.splitlines())
    assert properties["Type"] == "exec"
    assert properties["User"] == f"box-{task['id']}"
    assert properties["Slice"] == f"box-{task['id']}.slice"
    assert properties["ProtectSystem"] == "strict"
    assert properties["ProtectHome"] == "yes"
    assert properties["PrivateTmp"] == "yes"
    assert properties["NoNewPrivileges"] == "yes"
    assert f"BOX_TASK={task['id']}" in properties["Environment"]
    assert f"BOX_SOCKET=/var/lib/box/tasks/{task['id']}/broker.sock" in properties["Environment"]
    assert (properties["ActiveState"], properties["SubState"]) == ("active", "running")
    broker = machine.run(
        "systemctl", "show", f"box-broker@{task['id']}.service", "-p", "User,ActiveState"
    ).stdout
    assert "User=boxd-broker" in broker and "ActiveState=active" in broker
    boxctl(machine, "stop", task["id"])
    socket = machine.run("systemctl", "is-active", f"box-broker@{task['id']}.socket", check=False)
    assert socket.stdout.strip() == "inactive"
    gone = machine.run("test", "-e", f"/var/lib/box/tasks/{task['id']}/broker.sock", check=False)
    assert gone.returncode != 0


def test_task_objects_signal_their_changes(machine: Machine, token: str) -> None:
    monitor = machine.spawn(
        "busctl",
        "--json=short",
        "monitor",
        "--match=type='signal',sender='org.boxd.Box1',"
        "interface='org.freedesktop.DBus.Properties',member='PropertiesChanged',"
        "path_namespace='/org/boxd/Box1/task'",
    )
    try:
        machine.run("sleep", "0.5")  # busctl monitor is listening once it has started
        task = start_fake(machine, token, "step watched")
        assert finish(machine, task["id"])["state"] == "done"
        machine.run("sleep", "0.5")
    finally:
        monitor.terminate()
    output, _ = monitor.communicate(timeout=10)
    states = []
    steps = []
    for line in output.splitlines():
        message = json.loads(line)
        if message.get("path") != f"/org/boxd/Box1/task/{task['id']}":
            continue
        changed = message["payload"]["data"][1]
        if "State" in changed:
            states.append(changed["State"]["data"])
        if "Step" in changed:
            steps.append(changed["Step"]["data"])
    assert states == ["running", "done"]
    assert steps == ["watched"]


def test_manager_interface_is_introspectable(machine: Machine) -> None:
    shown = machine.run("busctl", "introspect", "--list", "org.boxd.Box1", "/org/boxd/Box1")
    for method in (
        "CreateTask",
        "GetTask",
        "ListTasks",
        "StopTask",
        "GetSettings",
        "SetSettings",
        "CreateToken",
    ):
        assert f".{method}" in shown.stdout
