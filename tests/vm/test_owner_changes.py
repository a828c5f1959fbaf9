"""The owner's changes on a real box: uploads with curl and boxctl, deletions and renames, each an
entry of the workspace's stack of its own (boxd/manager/owner_changes.py). The next task (the
fake worker, one shell command per prompt line) sees them and its `saw` names them; a task
running meanwhile keeps its own view and is not broken; undo takes one out as it takes a task's.
A hostile upload, one over the caps and one on a full disk are refused in words, with nothing
recorded and nothing left in the layer store."""

import base64
import io
import json
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.box_api import API, boxctl, busctl_call, busctl_result, finish, http, start_fake
from testbed.machine import BOX_HOME, Machine, install_boxd
from testbed.npm_registry import wait_for_droid
from testbed.wallet_calls import pending


def new_workspace(machine: Machine, token: str, name: str) -> None:
    status, made = http(machine, "POST", "/api/workspaces", token, json.dumps({"name": name}))
    assert status == 201, made


def curl(machine: Machine, token: str, *argv: str) -> tuple[int, Any]:
    done = machine.run(
        "curl",
        "-sS",
        "-w",
        "\n%{http_code}",
        "-H",
        f"Authorization: Bearer {token}",
        *argv,
        timeout=120,
    )
    text, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(text) if text else None


def seen(machine: Machine, token: str, workspace: str, command: str) -> dict[str, Any]:
    task = start_fake(machine, token, f"sh {command}", workspace=workspace)
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    return ended


def owner_tasks(machine: Machine) -> list[dict[str, Any]]:
    listed = json.loads(boxctl(machine, "list", "--json").stdout)
    return [task for task in listed if task["worker"] == "owner"]


def staged(machine: Machine, workspace: str) -> str:
    return machine.run(
        "sh", "-c", f"ls -A {BOX_HOME}/layers/{workspace} | grep '^.staging' || true"
    ).stdout


def test_an_upload_is_seen_by_the_next_task_named_by_saw_and_undone_like_one(
    machine: Machine, token: str
) -> None:
    new_workspace(machine, token, "uploads")
    # A task running through the upload: it waits for an approval the test answers after.
    running = start_fake(machine, token, "ask go on?\nsh ls -R", workspace="uploads")
    asked = pending(machine, running["id"])

    machine.run("sh", "-c", "printf 'hello from the owner\\n' > /root/notes.md")
    status, change = curl(
        machine, token, "-T", "/root/notes.md", f"{API}/api/workspaces/uploads/files/docs/notes.md"
    )
    assert status == 201, change
    assert change["worker"] == "owner" and change["state"] == "done"
    assert change["title"] == "Added notes.md to docs/" and change["source"] == "api"

    boxctl(machine, "approve", asked["id"])
    ended = finish(machine, running["id"])
    assert ended["state"] == "done", ended
    assert "notes.md" not in ended["steps"][-1]["text"]

    after = seen(machine, token, "uploads", "cat docs/notes.md")
    assert after["steps"][0]["text"] == "hello from the owner"
    assert after["saw"][:2] == [running["id"], change["id"]]

    # boxctl put, as the caller: a folder and a file, into a folder of the workspace.
    machine.run(
        "sh",
        "-c",
        "mkdir -p /root/pics/inner && echo a > /root/pics/inner/a.txt && echo b > /root/b.txt",
    )
    put = json.loads(
        boxctl(machine, "put", "/root/pics", "/root/b.txt", "uploads:in", "--json").stdout
    )
    assert put["worker"] == "owner" and put["source"] == "boxctl"
    listing = seen(machine, token, "uploads", "cat in/pics/inner/a.txt in/b.txt")
    assert listing["steps"][0]["text"] == "a\nb"

    diff = json.loads(boxctl(machine, "diff", change["id"], "--json").stdout)
    assert [(f["path"], f["change"]) for f in diff["files"]] == [
        ("docs", "added"),
        ("docs/notes.md", "added"),
    ]
    undone = json.loads(boxctl(machine, "undo", change["id"], "--json").stdout)
    assert undone["state"] == "undone"
    gone = seen(machine, token, "uploads", "ls docs 2>&1 || true")
    assert "notes.md" not in gone["steps"][0]["text"]


def test_delete_and_rename(machine: Machine, token: str) -> None:
    new_workspace(machine, token, "moves")
    wrote = start_fake(
        machine, token, "write a.md alpha\nwrite d/b.md beta\nwrite gone.md x", workspace="moves"
    )
    assert finish(machine, wrote["id"])["state"] == "done"
    status, deleted = curl(
        machine, token, "-X", "DELETE", f"{API}/api/workspaces/moves/files/gone.md"
    )
    assert status == 201 and deleted["title"] == "Deleted gone.md", deleted
    body = json.dumps({"from": "d", "to": "e/d2"})
    status, renamed = http(machine, "POST", "/api/workspaces/moves/rename", token, body)
    assert status == 201 and renamed["title"] == "Renamed d to e/d2", renamed
    status, again = http(
        machine,
        "POST",
        "/api/workspaces/moves/rename",
        token,
        json.dumps({"from": "a.md", "to": "e"}),
    )
    assert status == 400 and "already in the workspace" in again["error"]
    after = seen(machine, token, "moves", "ls; cat e/d2/b.md; ls d gone.md 2>&1 || true")
    text = after["steps"][0]["text"]
    assert text.startswith("a.md\ne\nbeta"), text
    assert "cannot access 'd'" in text and "cannot access 'gone.md'" in text
    # busctl, a client no one here wrote, as the owner by polkit: the change is a task too.
    renamed_again = busctl_result(
        busctl_call(machine, "RenameInWorkspace", "moves", "a.md", "z.md")
    )
    assert renamed_again["title"] == "Renamed a.md to z.md" and renamed_again["source"] == "boxctl"
    # A change cut off before its record left a staged layer: boxd removes it as it starts, and
    # the recorded changes stand as they were.
    machine.run("mkdir", "-p", f"{BOX_HOME}/layers/moves/.staging-cutoff/half")
    machine.run("systemctl", "restart", "boxd.service")
    assert staged(machine, "moves") == ""
    # A task changes what the owner renamed: the files are the tasks' to change.
    changed = start_fake(machine, token, "write e/d2/b.md gamma\nsh cat z.md", workspace="moves")
    ended = finish(machine, changed["id"])
    assert ended["state"] == "done" and ended["steps"][-1]["text"] == "alpha", ended


def _tar(*members: tuple[str, bytes, str]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, content, target in members:
            info = tarfile.TarInfo(name)
            if target:
                info.type, info.linkname = tarfile.SYMTYPE, target
                archive.addfile(info)
            else:
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
    return out.getvalue()


def test_hostile_uploads_are_refused_and_leave_nothing(machine: Machine, token: str) -> None:
    new_workspace(machine, token, "hostile")
    before = len(owner_tasks(machine))
    cases = {
        "link": (
            _tar(("ok.md", b"ok", ""), ("etc", b"", "/etc"), ("etc/x", b"x", "")),
            "symbolic link",
        ),
        "dotdot": (_tar(("../../escape", b"x", "")), "not a path in the workspace"),
        "absolute": (_tar(("/etc/cron.d/evil", b"x", "")), "absolute path"),
        "cut": (_tar(("a", b"A" * 5000, ""))[:3000], "not a whole tar archive"),
    }
    for name, (data, words) in cases.items():
        encoded = base64.b64encode(data).decode()
        machine.run("sh", "-c", f"base64 -d > /root/{name}.tar", input=encoded)
        status, refused = curl(
            machine,
            token,
            "-H",
            "Content-Type: application/x-tar",
            "--data-binary",
            f"@/root/{name}.tar",
            f"{API}/api/workspaces/hostile/files",
        )
        assert status == 400 and words in refused["error"], (name, refused)
    # Over the caps, made by GNU tar: 10,001 files in one upload.
    machine.run(
        "sh",
        "-c",
        "mkdir -p /root/many && cd /root/many && seq 10001 | xargs touch"
        " && tar czf /root/many.tgz .",
    )
    status, refused = curl(
        machine,
        token,
        "-H",
        "Content-Type: application/gzip",
        "--data-binary",
        "@/root/many.tgz",
        f"{API}/api/workspaces/hostile/files",
    )
    assert status == 400 and "10000" in refused["error"], refused
    assert "nothing was added" in refused["error"]
    assert machine.run("test", "-e", "/etc/cron.d/evil", check=False).returncode != 0
    assert len(owner_tasks(machine)) == before
    assert staged(machine, "hostile") == ""
    # An app's token is not the owner's: it may not change a workspace.
    app = boxctl(machine, "token", "create", "--app", "--name", "uploader").stdout.strip()
    status, refused = curl(machine, app, "-X", "DELETE", f"{API}/api/workspaces/hostile/files/x")
    assert status == 403, refused


@pytest.fixture
def small_disk() -> Iterator[Machine]:
    """A machine whose BOX_HOME is a small ext4 of its own, as in test_disk_full.py: an image
    file loop-mounted on the host and bound over /var/lib/box."""
    place = Path(tempfile.mkdtemp(prefix="boxd-owner-disk-", dir="/var/tmp"))
    image, mount = place / "disk.img", place / "home"
    mount.mkdir()
    subprocess.run(["truncate", "-s", "128M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    mount.chmod(0o755)
    machine = Machine(binds=[(mount, BOX_HOME, False)])
    try:
        machine.start()
        install_boxd(machine)
        wait_for_droid(machine)
        yield machine
    finally:
        machine.stop()
        subprocess.run(["umount", str(mount)], check=False)
        shutil.rmtree(place, ignore_errors=True)


def test_a_full_disk_refuses_an_upload_in_words_and_loses_nothing(
    small_disk: Machine,
) -> None:
    machine = small_disk
    token = boxctl(machine, "token", "create").stdout.strip()
    machine.run("sh", "-c", "head -c 4M /dev/urandom > /root/small.bin")
    status, first = curl(
        machine, token, "-T", "/root/small.bin", f"{API}/api/workspaces/home/files/first.bin"
    )
    assert status == 201, first
    # The owner's own file fills the disk but for a few MiB.
    machine.run(
        "sh",
        "-c",
        f"fallocate -l $(( $(stat -f -c '%a*%S' {BOX_HOME}) - 8*1024*1024 )) {BOX_HOME}/filler",
    )
    status, refused = curl(
        machine, token, "-T", "/root/small.bin", f"{API}/api/workspaces/home/files/second.bin"
    )
    assert status == 507, refused
    assert "too full" in refused["error"] and "nothing was added" in refused["error"]
    assert [t["id"] for t in owner_tasks(machine)] == [first["id"]]
    assert staged(machine, "home") == ""
    machine.run("rm", f"{BOX_HOME}/filler")
    status, second = curl(
        machine, token, "-T", "/root/small.bin", f"{API}/api/workspaces/home/files/second.bin"
    )
    assert status == 201, second
    ended = seen(machine, token, "home", "cmp first.bin second.bin && echo same")
    assert ended["steps"][0]["text"] == "same"


def test_boxctl_put_reads_as_the_caller(machine: Machine, token: str, owner: str) -> None:
    """A member of boxd-owner puts files of theirs; a file only root may read stays out, since
    boxctl reads as its caller, and nothing is added."""
    new_workspace(machine, token, "theirs")
    mine = f"/home/{owner}/mine.md"
    machine.run("sh", "-c", f"echo mine > {mine}", user=owner)
    put = json.loads(boxctl(machine, "put", mine, "theirs", "--json", user=owner).stdout)
    assert put["worker"] == "owner" and put["user"] == owner, put
    before = len(owner_tasks(machine))
    refused = boxctl(machine, "put", "/etc/shadow", "theirs", user=owner, check=False)
    assert refused.returncode == 1
    assert "Permission denied" in refused.stderr, refused.stderr
    assert len(owner_tasks(machine)) == before
    ended = seen(machine, token, "theirs", "ls")
    assert ended["steps"][0]["text"] == "mine.md"
    # A workspace made with a folder's files: its first change imports the folder's contents.
    folder = f"/home/{owner}/papers"
    machine.run("sh", "-c", f"mkdir -p {folder}/in && echo p > {folder}/in/p.md", user=owner)
    made = json.loads(
        boxctl(
            machine, "workspace", "create", "papers", "--from", folder, "--json", user=owner
        ).stdout
    )
    assert made["name"] == "papers" and made["change"]["worker"] == "owner", made
    assert seen(machine, token, "papers", "cat in/p.md")["steps"][0]["text"] == "p"
    # The owner's own changes show in the mounted view too, readable by a member of boxd-owner
    # (the layer opened to them before it joined, the view remade after).
    for workspace, path, text in (("theirs", "mine.md", "mine"), ("papers", "in/p.md", "p")):
        shown = machine.run("cat", f"/run/boxd/views/{workspace}/{path}", user=owner)
        assert shown.stdout.strip() == text, shown


def test_multipart_and_a_gzip_tar_from_real_clients(machine: Machine, token: str) -> None:
    """curl -F, with a relative path in a part's filename as a browser sends a folder picked
    whole; and GNU tar's gzip piped to curl."""
    new_workspace(machine, token, "forms")
    machine.run("sh", "-c", "echo one > /root/one.txt && echo two > /root/two.txt")
    status, change = curl(
        machine,
        token,
        "-F",
        "file=@/root/one.txt;filename=picked/one.txt",
        "-F",
        "file=@/root/two.txt;filename=picked/deeper/two.txt",
        f"{API}/api/workspaces/forms/files/in",
    )
    assert status == 201 and change["title"] == "Added 2 files to in/", change
    machine.run("sh", "-c", "mkdir -p /root/tree/a && echo z > /root/tree/a/z.txt")
    done = machine.run(
        "sh",
        "-c",
        f"tar czf - -C /root/tree . | curl -sS -w '\\n%{{http_code}}' --data-binary @- "
        f"-H 'Content-Type: application/gzip' -H 'Authorization: Bearer {token}' "
        f"{API}/api/workspaces/forms/files",
    )
    text, _, code = done.stdout.rpartition("\n")
    assert code == "201", text
    ended = seen(machine, token, "forms", "cat in/picked/one.txt in/picked/deeper/two.txt a/z.txt")
    assert ended["steps"][0]["text"] == "one\ntwo\nz"
