"""Personal folders: a task works on a copy of the owner's real folders, which change only when
the owner keeps the task, and not at all when a file there changed meanwhile."""

import json

from testbed.box_api import boxctl, finish, http, start_fake
from testbed.folders import (
    folder,
    keep,
    tree,
)
from testbed.machine import Machine

OWNER_ONLY = {"error": "only this computer's own screen or the owner's paired device can do this"}


def test_keep_applies_writes_and_deletions(machine: Machine, owner: str, owner_token: str) -> None:
    real = folder(machine, owner, "notes", {"a.txt": "old", "b.txt": "bye", "sub/c.txt": "c"})
    task = start_fake(
        machine,
        owner_token,
        "sh cat a.txt\nwrite a.txt new\ndelete b.txt\nwrite fresh/d.txt made",
        folder=real + "/",
    )
    assert task["folder"] == real and task["folders"] == [real]
    assert task["workspace"].startswith("owner-notes-")
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert ended["review"] == "pending"
    assert ended["steps"][0]["text"] == "old"
    # The copy of a member's folder gets no owner's view (other members of boxd-owner would read
    # it), and its layer no ACL entry for boxd-owner.
    gone = machine.run("test", "-e", f"/run/boxd/views/{task['workspace']}", check=False)
    assert gone.returncode != 0
    layers = f"/var/lib/box/layers/{task['workspace']}"
    entries = machine.run(
        "/usr/lib/boxd/venv/bin/python",
        "-c",
        "import os, sys; print(sum('system.posix_acl_access' in os.listxattr(os.path.join(d, n),"
        " follow_symlinks=False) for d, ds, fs in os.walk(sys.argv[1]) for n in ds + fs))",
        layers,
    ).stdout
    assert entries.strip() == "0"
    # Done is not kept: the real folder is as it was.
    assert tree(machine, real) == {"a.txt": "old", "b.txt": "bye", "sub/c.txt": "c"}

    status, kept = keep(machine, owner_token, task["id"])
    assert status == 200, kept
    assert kept["review"] == "kept"
    assert tree(machine, real) == {"a.txt": "new", "fresh/d.txt": "made", "sub/c.txt": "c"}
    owners = machine.run("stat", "-c", "%U", f"{real}/a.txt", f"{real}/fresh/d.txt").stdout
    assert owners.split() == [owner, owner]
    status, again = keep(machine, owner_token, task["id"])
    assert (status, again) == (
        400,
        {"error": f"task {task['id']} was already kept, so there is nothing to keep"},
    )
    status, undo = http(machine, "POST", f"/api/tasks/{task['id']}/undo", owner_token)
    assert status == 400 and "its changes are in your folders now" in undo["error"]

    # The next task on the folder starts from what was kept.
    later = start_fake(machine, owner_token, "sh cat a.txt; echo; ls", folder=real)
    assert later["workspace"] == task["workspace"]
    assert finish(machine, later["id"])["steps"][0]["text"] == "new\na.txt\nfresh\nsub"


def test_a_conflicting_edit_is_found_and_nothing_is_applied(
    machine: Machine, owner: str, owner_token: str
) -> None:
    real = folder(machine, owner, "draft", {"a.txt": "one", "b.txt": "two"})
    task = start_fake(machine, owner_token, "write a.txt task\nwrite new.txt task", folder=real)
    assert finish(machine, task["id"])["review"] == "pending"
    # The owner edits a.txt in the real folder after the task started.
    machine.run("sh", "-c", f"sleep 0.01; printf mine > {real}/a.txt")

    status, found = keep(machine, owner_token, task["id"])
    assert status == 200, found
    assert found["review"] == "conflict"
    assert found["error"] == (
        "Nothing was applied: these files changed in your folders since the task started: "
        "a.txt. Undo the task, or change them back and keep it again."
    )
    assert tree(machine, real) == {"a.txt": "mine", "b.txt": "two"}


def test_undo_leaves_the_folder_untouched(machine: Machine, owner: str, owner_token: str) -> None:
    real = folder(machine, owner, "undoing", {"a.txt": "one"})
    task = start_fake(machine, owner_token, "write a.txt task\ndelete a.txt", folder=real)
    assert finish(machine, task["id"])["review"] == "pending"
    undone = json.loads(boxctl(machine, "undo", task["id"], "--json", user=owner).stdout)
    assert (undone["state"], undone["review"]) == ("undone", "undone")
    assert tree(machine, real) == {"a.txt": "one"}
    status, refused = keep(machine, owner_token, task["id"])
    assert (status, refused) == (
        400,
        {"error": f"task {task['id']} was undone, so there is nothing to keep"},
    )


def test_several_folders_side_by_side(machine: Machine, owner: str, owner_token: str) -> None:
    notes = folder(machine, owner, "side/notes", {"n.txt": "n"})
    code = folder(machine, owner, "side/code", {"main.py": "print(1)"})
    task = start_fake(
        machine,
        owner_token,
        "sh ls\nwrite notes/n.txt changed\nwrite code/new.py x\nsh touch top.txt || echo refused",
        folders=[notes, code],
    )
    assert task["folders"] == [notes, code] and task["folder"] == notes
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert ended["steps"][0]["text"] == "code\nnotes"
    assert "refused" in ended["steps"][3]["text"]
    # With boxctl, as the owner, over D-Bus.
    kept = json.loads(boxctl(machine, "keep", task["id"], "--json", user=owner).stdout)
    assert kept["review"] == "kept"
    assert tree(machine, notes) == {"n.txt": "changed"}
    assert tree(machine, code) == {"main.py": "print(1)", "new.py": "x"}


def test_folders_agents_may_not_use(machine: Machine, owner: str, owner_token: str) -> None:
    machine.run("mkdir", "-p", "/srv/elsewhere", f"/home/{owner}/roots")
    machine.run("chown", f"{owner}:{owner}", "/srv/elsewhere")
    machine.run("ln", "-sfn", "/var/lib/box/workspaces/home", f"/home/{owner}/boxlink")

    def refused(path: str) -> str:
        status, answer = http(
            machine,
            "POST",
            "/api/tasks",
            owner_token,
            json.dumps({"title": "t", "prompt": "step x", "worker": "fake", "folder": path}),
        )
        assert status == 400, answer
        return str(answer["error"])

    assert refused("/srv/elsewhere") == (
        f"folder /srv/elsewhere: it is not in your home folder (/home/{owner}) or in Settings "
        "agentFolders"
    )
    assert refused(f"/home/{owner}/roots") == (
        f"folder /home/{owner}/roots: it belongs to root; agents may not use root's folders"
    )
    # Followed as the owner's account, the link leads nowhere it may go; followed by root,
    # into the box's own state.
    assert refused(f"/home/{owner}/boxlink") == (
        f"folder /home/{owner}/boxlink: it cannot be followed to a real folder (permission denied)"
    )
    as_root = boxctl(machine, "start", "--folder", f"/home/{owner}/boxlink", "x", check=False)
    assert as_root.stderr == (
        f"boxctl: folder /home/{owner}/boxlink: it holds the box's own state (a link to "
        "/var/lib/box/workspaces/home); agents never work on that\n"
    )
    assert refused(f"/home/{owner}/missing") == (
        f"folder /home/{owner}/missing: there is no such folder"
    )
    assert refused("/etc") == "folder /etc: it is part of the system; agents never work on that"
    # Settings agentFolders lets the owner name a folder outside the home.
    boxctl(machine, "settings", "set", "agentFolders", '["/srv"]')
    try:
        task = start_fake(machine, owner_token, "step fine", folder="/srv/elsewhere")
        assert finish(machine, task["id"])["state"] == "done"
    finally:
        boxctl(machine, "settings", "set", "agentFolders", "[]")


def test_only_the_owner_may_use_personal_folders(
    machine: Machine, owner: str, owner_token: str
) -> None:
    real = folder(machine, owner, "private", {"a.txt": "secret"})
    app = boxctl(machine, "token", "create", "--name", "an app", "--app").stdout.strip()
    body = {"title": "t", "prompt": "sh cat a.txt", "worker": "fake", "folder": real}
    assert http(machine, "POST", "/api/tasks", app, json.dumps(body)) == (403, OWNER_ONLY)
    task = start_fake(machine, owner_token, "write a.txt changed", folder=real)
    assert finish(machine, task["id"])["state"] == "done"
    assert keep(machine, app, task["id"]) == (403, OWNER_ONLY)
    mirror = {"title": "t", "prompt": "sh cat a.txt", "worker": "fake"}
    mirror["workspace"] = task["workspace"]
    assert http(machine, "POST", "/api/tasks", app, json.dumps(mirror)) == (403, OWNER_ONLY)
    # An app may still start tasks on workspaces.
    assert finish(machine, start_fake(machine, app, "step hi")["id"])["state"] == "done"
    assert tree(machine, real) == {"a.txt": "secret"}
