"""The review of what a task changed (`boxctl diff`, `GET /api/tasks/{id}/diff`, D-Bus
DiffTask), on a real box: the layer a fake task wrote as an attacker would (a link to
/etc/shadow, a FIFO, a 100 MB file, a name with terminal escapes, a binary file, deletions), a
task still waiting, one queued, and a personal-folder task reviewed before keep."""

import json
from typing import Any

import pytest

from testbed.box_api import boxctl, finish, http, start_fake, wait_for_step
from testbed.machine import Machine

OWNER_ONLY = (
    403,
    {"error": "only this computer's own screen or the owner's paired device can do this"},
)
ESCAPED = "esc\x1b[2J\x1b]0;owned\x07name"


@pytest.fixture(scope="module")
def owner_token(machine: Machine, owner: str) -> str:
    return boxctl(machine, "token", "create", "--name", "reviewer", user=owner).stdout.strip()


def review(machine: Machine, token: str, task_id: str) -> tuple[int, Any]:
    return http(machine, "GET", f"/api/tasks/{task_id}/diff", token)


def by_path(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["path"]: item for item in answer["files"]}


def test_an_attackers_layer_is_reviewed_without_following_or_blocking(
    machine: Machine, owner: str, owner_token: str
) -> None:
    status, _ = http(machine, "POST", "/api/workspaces", owner_token, json.dumps({"name": "rev"}))
    assert status == 201
    base = "/var/lib/box/workspaces/rev"
    machine.run(
        "sh",
        "-c",
        f"printf 'one\\ntwo\\n' > {base}/b.txt && printf 'bye\\n' > {base}/gone.txt && "
        f"mkdir {base}/sub && printf 'c\\n' > {base}/sub/c.txt",
    )
    # Files the owner put there for tasks to change.
    machine.run("chmod", "-R", "a+rwX", f"{base}/b.txt", f"{base}/sub")
    script = "\n".join(
        [
            "write notes.txt hello",
            "sh printf 'one\\n2\\n' > b.txt",
            "delete gone.txt",
            "sh rm -r sub",
            "sh ln -s /etc/shadow secret",
            "sh mkfifo pipe",
            "sh truncate -s 100M big.bin",
            "sh printf '\\000\\001\\002' > blob.bin",
            "sh printf 'x\\n' > \"$(printf 'caf\\351.txt')\"",
            "sh printf '\\033[31mred\\n' > \"$(printf 'esc\\033[2J\\033]0;owned\\007name')\"",
        ]
    )
    task = start_fake(machine, owner_token, script, workspace="rev")
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended

    status, answer = review(machine, owner_token, task["id"])
    assert status == 200, answer
    assert {k: answer[k] for k in ("id", "workspace", "state", "against", "truncated")} == {
        "id": task["id"],
        "workspace": "rev",
        "state": "done",
        "against": "saw",
        "truncated": False,
    }
    files = by_path(answer)
    assert set(files) == {
        "notes.txt",
        "b.txt",
        "gone.txt",
        "sub",
        "sub/c.txt",
        "secret",
        "pipe",
        "big.bin",
        "blob.bin",
        ESCAPED,
        "caf\\xe9.txt",
    }
    assert files["notes.txt"]["diff"] == (
        "--- /dev/null\n+++ b/notes.txt\n@@ -0,0 +1 @@\n+hello\n\\ No newline at end of file\n"
    )
    assert files["b.txt"]["diff"] == ("--- a/b.txt\n+++ b/b.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n")
    # Real overlayfs whiteouts: a deleted file, and a deleted folder with its file.
    assert files["gone.txt"]["change"] == "deleted"
    assert files["gone.txt"]["diff"].endswith("@@ -1 +0,0 @@\n-bye\n")
    assert (files["sub"]["change"], files["sub"]["kind"]) == ("deleted", "dir")
    assert files["sub/c.txt"]["change"] == "deleted"
    assert files["secret"] == {
        "path": "secret",
        "change": "added",
        "kind": "link",
        "target": "/etc/shadow",
    }
    assert "root:" not in json.dumps(answer)
    assert files["pipe"] == {"path": "pipe", "change": "added", "kind": "other"}
    assert files["big.bin"]["tooLarge"] is True and "diff" not in files["big.bin"]
    assert files["blob.bin"]["binary"] is True and "diff" not in files["blob.bin"]
    assert "+\x1b[31mred\n" in files[ESCAPED]["diff"]
    # A name that is not UTF-8: its byte shown as \xe9, and said.
    assert files["caf\\xe9.txt"]["nameNotUtf8"] is True
    assert "+++ b/caf\\xe9.txt\n" in files["caf\\xe9.txt"]["diff"]

    # boxctl: the same answer as JSON, and as text with every escape made visible.
    as_json = json.loads(boxctl(machine, "diff", task["id"], "--json", user=owner).stdout)
    assert as_json == answer
    text = boxctl(machine, "diff", task["id"], user=owner).stdout
    assert "\x1b" not in text and "\x07" not in text
    assert "added    esc\\x1b[2J\\x1b]0;owned\\x07name" in text
    assert "+\\x1b[31mred" in text
    assert "added    secret  (link to /etc/shadow)" in text
    assert "added    blob.bin  (binary)" in text
    assert "deleted  sub  (folder)" in text

    # Owner only: an app's and a member's tokens get the seed's words, even for a task of theirs.
    app = boxctl(machine, "token", "create", "--name", "diff-app", "--app").stdout.strip()
    member = boxctl(machine, "token", "create", "--member", "u-dora").stdout.strip()
    own = start_fake(machine, app, "write mine.txt app")
    finish(machine, own["id"])
    for caller in (app, member):
        assert review(machine, caller, task["id"]) == OWNER_ONLY
    assert review(machine, app, own["id"]) == OWNER_ONLY
    # No token at all: 401.
    assert http(machine, "GET", f"/api/tasks/{task['id']}/diff")[0] == 401


def test_tasks_with_no_layer_running_and_queued(machine: Machine, owner_token: str) -> None:
    assert review(machine, owner_token, "tzzzzzzzzz") == (404, {"error": "no task tzzzzzzzzz"})

    failed = start_fake(machine, owner_token, "write junk.txt junk\nfail on purpose")
    assert finish(machine, failed["id"])["state"] == "failed"
    assert review(machine, owner_token, failed["id"]) == (
        400,
        {
            "error": f"task {failed['id']} failed: its changes were thrown away, so there is "
            "nothing to review"
        },
    )

    # A task waiting for an OK is reviewed as it stands: its upper layer, read as it works.
    waiting = start_fake(machine, owner_token, "write early.txt early\nask may I go on?")
    wait_for_step(machine, waiting["id"], 1)
    status, answer = review(machine, owner_token, waiting["id"])
    assert status == 200, answer
    assert answer["state"] in ("running", "waiting")
    assert [item["path"] for item in answer["files"]] == ["early.txt"]
    undone = json.loads(boxctl(machine, "undo", waiting["id"], "--json").stdout)
    assert undone["state"] == "undone"
    assert review(machine, owner_token, waiting["id"]) == (
        400,
        {
            "error": f"task {waiting['id']} was undone: its changes are gone, so there is "
            "nothing to review"
        },
    )

    # Queued: it has changed nothing yet.
    boxctl(machine, "pause")
    try:
        queued = start_fake(machine, owner_token, "write later.txt x")
        assert queued["state"] == "queued"
        status, answer = review(machine, owner_token, queued["id"])
        assert (status, answer["files"], answer["state"]) == (200, [], "queued")
    finally:
        boxctl(machine, "resume")
    assert finish(machine, queued["id"])["state"] == "done"


def test_a_personal_task_is_reviewed_before_keep(
    machine: Machine, owner: str, owner_token: str
) -> None:
    real = f"/home/{owner}/reviewed"
    machine.run("rm", "-rf", real)
    machine.run("mkdir", "-p", real)
    machine.run("sh", "-c", f"printf 'old\\n' > {real}/a.txt && printf 'bye\\n' > {real}/b.txt")
    machine.run("chown", "-R", f"{owner}:{owner}", real)
    task = start_fake(
        machine,
        owner_token,
        "sh printf 'new\\n' > a.txt\ndelete b.txt\nwrite fresh/d.txt made\nsh mkfifo pipe",
        folder=real,
    )
    ended = finish(machine, task["id"])
    assert (ended["state"], ended["review"]) == ("done", "pending")

    status, answer = review(machine, owner_token, task["id"])
    assert status == 200, answer
    assert answer["review"] == "pending"
    files = by_path(answer)
    assert list(files) == ["a.txt", "b.txt", "fresh", "fresh/d.txt", "pipe"]
    assert files["a.txt"]["diff"] == "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-old\n+new\n"
    assert files["b.txt"]["diff"] == "--- a/b.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"
    assert files["fresh/d.txt"]["change"] == "added"
    assert files["pipe"]["skipped"] == "keep leaves devices, sockets and FIFOs out"
    text = boxctl(machine, "diff", task["id"], user=owner).stdout
    assert text.startswith(f"Task {task['id']} (done, review pending) on owner-reviewed-")

    status, kept = http(machine, "POST", f"/api/tasks/{task['id']}/keep", owner_token)
    assert (status, kept["review"]) == (200, "kept")
    assert machine.run("cat", f"{real}/a.txt").stdout == "new\n"
    assert review(machine, owner_token, task["id"]) == (
        400,
        {
            "error": f"task {task['id']} was kept: its changes are in your folders now, so "
            "there is nothing to review"
        },
    )
