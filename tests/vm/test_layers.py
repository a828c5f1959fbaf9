"""Workspaces as layers: each task its own copy; done joins, failed leaves nothing, undo leaves."""

import base64
import json

from testbed.box_api import boxctl, database_bytes, finish, http, start_fake, wait_for_step
from testbed.machine import Machine


def new_workspace(machine: Machine, token: str, name: str) -> None:
    status, _ = http(machine, "POST", "/api/workspaces", token, json.dumps({"name": name}))
    assert status == 201


def files(machine: Machine, token: str, workspace: str) -> str:
    """What a new task sees in the workspace: each file with its contents."""
    task = start_fake(
        machine,
        token,
        'sh for f in $(ls); do echo "$f=$(cat $f)"; done',
        workspace=workspace,
    )
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    text = ended["steps"][0]["text"]
    return "" if text.startswith("ran ") else str(text)


def test_done_joins_and_undo_leaves_while_later_tasks_keep_theirs(
    machine: Machine, token: str
) -> None:
    new_workspace(machine, token, "stack")
    machine.run("sh", "-c", "echo base > /var/lib/box/workspaces/stack/b.txt")
    first = start_fake(
        machine, token, "write a.txt first\nwrite c.txt first\ndelete b.txt", workspace="stack"
    )
    assert finish(machine, first["id"])["state"] == "done"
    second = start_fake(machine, token, "sh cat a.txt\nwrite c.txt second", workspace="stack")
    assert second["saw"] == [first["id"]]
    ended = finish(machine, second["id"])
    assert ended["steps"][0]["text"] == "first"
    assert files(machine, token, "stack") == "a.txt=first\nc.txt=second"

    undone = json.loads(boxctl(machine, "undo", first["id"], "--json").stdout)
    assert undone["state"] == "undone"
    # a.txt was the first task's alone; c.txt the second rewrote keeps the second's words;
    # b.txt, which the first deleted, is back.
    assert files(machine, token, "stack") == "b.txt=base\nc.txt=second"
    again = boxctl(machine, "undo", first["id"], check=False)
    assert again.stderr.strip() == f"boxctl: task {first['id']} is already undone"
    status, over_http = http(machine, "POST", f"/api/tasks/{second['id']}/undo", token)
    assert status == 200 and over_http["state"] == "undone"
    assert files(machine, token, "stack") == "b.txt=base"


def test_a_failed_task_leaves_nothing(machine: Machine, token: str) -> None:
    new_workspace(machine, token, "failing")
    task = start_fake(machine, token, "write junk.txt junk\nfail on purpose", workspace="failing")
    assert finish(machine, task["id"])["state"] == "failed"
    assert files(machine, token, "failing") == ""
    assert machine.run("ls", "/var/lib/box/layers/failing").stdout.count("\n") == 1


def test_a_running_tasks_writes_are_its_own(machine: Machine, token: str) -> None:
    new_workspace(machine, token, "beside")
    busy = start_fake(machine, token, "write draft.txt unfinished\nsleep 60", workspace="beside")
    wait_for_step(machine, busy["id"])
    assert files(machine, token, "beside") == ""
    undone = json.loads(boxctl(machine, "undo", busy["id"], "--json").stdout)
    assert undone["state"] == "undone"
    assert undone["error"] == "Stopped by its owner, to undo it."
    assert (
        machine.run(
            "systemctl", "is-active", f"box-task-{busy['id']}.service", check=False
        ).stdout.strip()
        != "active"
    )
    assert files(machine, token, "beside") == ""


def test_files_shared_to_a_new_task(machine: Machine, token: str) -> None:
    content = b"private words 7f3a\n"
    files = [
        {"name": "notes.md", "content": base64.b64encode(content).decode()},
        {"name": "empty.txt", "content": ""},
    ]
    task = start_fake(machine, token, "sh wc -c notes.md empty.txt", files=files)
    assert task["workspace"] == f"files-{task['id']}"
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert ended["steps"][0]["text"].split() == ["19", "notes.md", "0", "empty.txt", "19", "total"]
    base = f"/var/lib/box/workspaces/files-{task['id']}/notes.md"
    assert machine.run("cat", base).stdout == content.decode()
    dump = database_bytes(machine)
    assert "private words" not in dump and base64.b64encode(content).decode() not in dump
    assert '"files":[{"name":"notes.md","size":19},{"name":"empty.txt","size":0}]' in dump
    status, refused = http(
        machine,
        "POST",
        "/api/tasks",
        token,
        json.dumps(
            {
                "title": "t",
                "prompt": "step x",
                "worker": "fake",
                "workspace": "home",
                "files": files,
            }
        ),
    )
    assert (status, refused) == (
        400,
        {
            "error": "files go to a new workspace of their own, so a "
            "task with files cannot also name workspace"
        },
    )
    status, refused = http(
        machine,
        "POST",
        "/api/tasks",
        token,
        json.dumps(
            {
                "title": "t",
                "prompt": "step x",
                "worker": "fake",
                "files": [{"name": "../x", "content": ""}],
            }
        ),
    )
    assert (status, refused) == (400, {"error": "files: '../x' is not a plain file name"})


def test_an_undone_layer_is_deleted_once_no_running_task_stacks_it(
    machine: Machine, token: str
) -> None:
    new_workspace(machine, token, "collect")
    first = start_fake(machine, token, "write a.txt first", workspace="collect")
    assert finish(machine, first["id"])["state"] == "done"
    layers = machine.run("ls", "/var/lib/box/layers/collect").stdout.split()
    assert len(layers) == 1
    layer = f"/var/lib/box/layers/collect/{layers[0]}"
    reader = start_fake(machine, token, "sleep 600", workspace="collect")
    assert reader["saw"] == [first["id"]]
    boxctl(machine, "undo", first["id"])
    # The running task still sees the first task's file through the layer it stacked.
    assert machine.run("cat", f"/var/lib/box/tasks/{reader['id']}/work/a.txt").stdout == "first"
    assert machine.run("test", "-d", layer, check=False).returncode == 0
    boxctl(machine, "stop", reader["id"])
    assert machine.run("test", "-e", layer, check=False).returncode == 1
