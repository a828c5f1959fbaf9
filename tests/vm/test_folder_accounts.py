"""Personal folders between the accounts of the box's owner (issue 32, point 6): Alice and Bob are
both in boxd-owner, neither is root, and Settings agentFolders is /home. Bob's home is one others
may list (0755), with a 0600 secret and ~/.ssh. A personal task works on folders of the account
that asked, read, reviewed and kept with that account's uid and groups: Alice gets nothing of
Bob's through a task's steps, its diff, the mirror or keep. Root may still work on anyone's
folder, as that folder's owner.

Where the unchanged code let an attack through, the test says what leaked before it fails on
the refusal the fixed code gives."""

import json
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.box_api import boxctl, finish, http, start_fake
from testbed.folders import tree
from testbed.machine import Machine

ALICE, BOB, CAROL = "alice", "bob", "carol"
TEAM = "team"
SECRET = "bob's secret, for bob alone"
BOBS_KEY = "ssh-ed25519 AAAAC3bob bob@box"
ALICES_KEY = "ssh-ed25519 AAAAC3alice alice@box"
ANOTHERS = "only root may start a task on another account's folder"
WORKSPACES = "/var/lib/box/workspaces"


def _account(machine: Machine, name: str, *groups: str) -> None:
    if machine.run("id", name, check=False).returncode != 0:
        machine.run("useradd", "-m", *(["-G", ",".join(groups)] if groups else []), name)


@pytest.fixture(scope="module", autouse=True)
def accounts(machine: Machine) -> Iterator[None]:
    """Alice and Bob, members of boxd-owner; Carol, an account of neither; agentFolders /home."""
    machine.run("sh", "-c", f"getent group {TEAM} || groupadd {TEAM}")
    _account(machine, ALICE, "boxd-owner", TEAM)
    _account(machine, BOB, "boxd-owner")
    _account(machine, CAROL)
    boxctl(machine, "settings", "set", "agentFolders", '["/home"]')
    yield
    boxctl(machine, "settings", "set", "agentFolders", "[]")


@pytest.fixture
def bobs_home(machine: Machine) -> str:
    """Bob's home as it was: listable by all, a 0600 secret, ~/.ssh 0700 with his key."""
    home = f"/home/{BOB}"
    script = (
        'cd "$1" && rm -rf secret.txt .ssh notes && chmod 0755 . '
        '&& printf %s "$2" > secret.txt && chmod 0600 secret.txt '
        '&& mkdir -m 0700 .ssh && printf "%s\\n" "$3" > .ssh/authorized_keys '
        "&& chmod 0600 .ssh/authorized_keys && mkdir notes && printf n > notes/n.txt "
        f"&& chown -R {BOB}:{BOB} ."
    )
    machine.run("sh", "-c", script, "-", home, SECRET, BOBS_KEY)
    return home


@pytest.fixture(scope="module")
def alice_token(machine: Machine) -> str:
    """A token Alice made: the account behind it is hers."""
    return boxctl(machine, "token", "create", "--name", "alice's phone", user=ALICE).stdout.strip()


@pytest.fixture(scope="module")
def bob_token(machine: Machine) -> str:
    return boxctl(machine, "token", "create", "--name", "bob's phone", user=BOB).stdout.strip()


def ask(machine: Machine, token: str, prompt: str, folder: str) -> tuple[int, Any]:
    body = {"title": "t", "prompt": prompt, "worker": "fake", "folder": folder}
    return http(machine, "POST", "/api/tasks", token, json.dumps(body))


def in_mirror(machine: Machine, workspace: str, text: str) -> str:
    """The files of a task's mirror that hold `text`."""
    return machine.run("grep", "-rlF", "--", text, f"{WORKSPACES}/{workspace}", check=False).stdout


def keys_of(machine: Machine) -> str:
    return machine.run("cat", f"/home/{BOB}/.ssh/authorized_keys").stdout


def refused(asked: str, link: str = "") -> str:
    return f"folder {asked}: it belongs to {BOB}, not to your account ({ALICE}){link}; {ANOTHERS}"


def test_a_task_on_another_accounts_folder_reads_nothing_of_it(
    machine: Machine, bobs_home: str, alice_token: str
) -> None:
    prompt = "sh cat secret.txt; cat .ssh/authorized_keys"
    status, task = ask(machine, alice_token, prompt, bobs_home)
    if status == 201:
        story = json.dumps(finish(machine, task["id"])["steps"])
        assert SECRET not in story, f"Alice read Bob's secret through the task's steps: {story}"
        mirrored = in_mirror(machine, task["workspace"], SECRET)
        assert not mirrored, f"Bob's 0600 secret is in the mirror Alice's task works on: {mirrored}"
    assert (status, task) == (400, {"error": refused(bobs_home)})
    # Over D-Bus, as Alice, and through a link in her own home to Bob's.
    machine.run("ln", "-sfn", bobs_home, f"/home/{ALICE}/bobs")
    started = boxctl(
        machine,
        *("start", "--worker", "fake", "--folder", f"/home/{ALICE}/bobs", prompt),
        user=ALICE,
        check=False,
    )
    if started.returncode == 0:
        story = json.dumps(finish(machine, started.stdout.strip())["steps"])
        assert SECRET not in story, f"Alice read Bob's secret over D-Bus: {story}"
    assert (started.returncode, started.stderr) == (
        1,
        f"boxctl: {refused(f'/home/{ALICE}/bobs', f' (a link to {bobs_home})')}\n",
    )
    # /home itself is root's, as it always was.
    assert ask(machine, alice_token, "sh ls", "/home") == (
        400,
        {"error": "folder /home: it belongs to root; agents may not use root's folders"},
    )


def test_the_review_shows_another_account_nothing(
    machine: Machine, bobs_home: str, alice_token: str, bob_token: str
) -> None:
    status, task = ask(machine, alice_token, "write secret.txt alice was here", bobs_home)
    if status == 201:
        assert finish(machine, task["id"])["review"] == "pending"
        diff = http(machine, "GET", f"/api/tasks/{task['id']}/diff", alice_token)[1]
        assert SECRET not in json.dumps(diff), f"Alice read Bob's secret through the diff: {diff}"
    assert (status, task) == (400, {"error": refused(bobs_home)})
    # Bob's own task is reviewed by Bob (or root), not by Alice.
    own = start_fake(machine, bob_token, "write secret.txt changed by bob", folder=bobs_home)
    assert finish(machine, own["id"])["review"] == "pending"
    path = f"/api/tasks/{own['id']}/diff"
    status, diff = http(machine, "GET", path, alice_token)
    assert SECRET not in json.dumps(diff), f"Alice read Bob's secret in his task's diff: {diff}"
    assert (status, diff) == (
        403,
        {"error": f"task {own['id']} was asked for by {BOB}: only {BOB} or root may review it"},
    )
    status, diff = http(machine, "GET", path, bob_token)
    assert status == 200 and f"-{SECRET}" in diff["files"][0]["diff"], diff
    shown = boxctl(machine, "diff", own["id"]).stdout
    assert f"-{SECRET}" in shown


def test_keep_writes_nothing_into_another_accounts_home(
    machine: Machine, bobs_home: str, alice_token: str, bob_token: str
) -> None:
    prompt = f"sh printf '%s\\n' '{ALICES_KEY}' >> .ssh/authorized_keys"
    status, task = ask(machine, alice_token, prompt, bobs_home)
    if status == 201:
        assert finish(machine, task["id"])["review"] == "pending"
        http(machine, "POST", f"/api/tasks/{task['id']}/keep", alice_token)
        keys = keys_of(machine)
        assert ALICES_KEY not in keys, f"Alice's keep wrote Bob's authorized_keys: {keys}"
    assert (status, task) == (400, {"error": refused(bobs_home)})
    # A task Bob asked for on his own folder is kept by Bob or root, not by Alice.
    own = start_fake(machine, bob_token, prompt, folder=bobs_home)
    assert finish(machine, own["id"])["review"] == "pending"
    status, kept = http(machine, "POST", f"/api/tasks/{own['id']}/keep", alice_token)
    assert ALICES_KEY not in keys_of(machine), f"Alice kept Bob's task into his home: {kept}"
    assert (status, kept) == (
        403,
        {"error": f"task {own['id']} was asked for by {BOB}: only {BOB} or root may keep it"},
    )
    over_dbus = boxctl(machine, "keep", own["id"], user=ALICE, check=False)
    assert over_dbus.returncode == 1 and "only bob or root may keep it" in over_dbus.stderr
    assert keys_of(machine) == f"{BOBS_KEY}\n"
    # Bob keeps it himself: what he asked for lands, as his.
    kept = json.loads(boxctl(machine, "keep", own["id"], "--json", user=BOB).stdout)
    assert kept["review"] == "kept"
    assert keys_of(machine) == f"{BOBS_KEY}\n{ALICES_KEY}\n"
    owner = machine.run("stat", "-c", "%U %a", f"{bobs_home}/.ssh/authorized_keys").stdout
    assert owner.split() == [BOB, "600"]


def test_another_accounts_folder_swapped_in_before_the_task_starts_is_not_read(
    machine: Machine, alice_token: str
) -> None:
    """Alice's shared drop folder, where Bob keeps a folder of his: she asks for her own folder
    beside it, and while the task waits to start, renames Bob's into its place."""
    shared = f"/home/{ALICE}/shared"
    machine.run("rm", "-rf", shared)
    machine.run("mkdir", "-p", f"{shared}/proj")
    machine.run("chown", "-R", f"{ALICE}:{ALICE}", shared)
    machine.run("chmod", "0755", f"/home/{ALICE}")
    machine.run("chmod", "0777", shared)
    machine.run(
        "sh",
        "-c",
        'mkdir "$1" && printf %s "$2" > "$1/secret.txt" && chmod 0600 "$1/secret.txt"',
        "-",
        f"{shared}/bobs",
        SECRET,
        user=BOB,
    )
    boxctl(machine, "pause")
    try:
        task = start_fake(machine, alice_token, "sh cat secret.txt", folder=f"{shared}/proj")
        assert task["state"] == "queued"
        machine.run("sh", "-c", f"cd {shared} && rmdir proj && mv bobs proj", user=ALICE)
    finally:
        boxctl(machine, "resume")
    ended = finish(machine, task["id"])
    story = json.dumps(ended["steps"])
    assert SECRET not in story, f"Alice read Bob's secret through a folder swapped in: {story}"
    assert (ended["state"], ended["error"]) == (
        "failed",
        f"The task could not start: folder {shared}/proj belongs to {BOB} now, not to {ALICE}, "
        "who asked for the task",
    )


def test_root_works_on_anyones_folder_as_its_owner(
    machine: Machine, bobs_home: str, token: str, alice_token: str
) -> None:
    notes = f"{bobs_home}/notes"
    # Carol's file in Bob's folder, which Bob cannot read: root asking does not read it either.
    machine.run("sh", "-c", f"printf carol > {notes}/carol.txt")
    machine.run("chown", f"{CAROL}:{CAROL}", f"{notes}/carol.txt")
    machine.run("chmod", "0600", f"{notes}/carol.txt")
    task = start_fake(machine, token, "sh ls; cat n.txt\nwrite n.txt by root", folder=notes)
    ended = finish(machine, task["id"])
    assert (ended["state"], ended["review"]) == ("done", "pending"), ended
    assert ended["steps"][0]["text"] == "n.txt\nn"
    # Neither Alice nor Bob keeps a task root asked for.
    status, answer = http(machine, "POST", f"/api/tasks/{task['id']}/keep", alice_token)
    assert (status, answer) == (
        403,
        {"error": f"task {task['id']} was asked for by root: only root may keep it"},
    )
    kept = json.loads(boxctl(machine, "keep", task["id"], "--json").stdout)
    assert kept["review"] == "kept"
    assert tree(machine, notes) == {"n.txt": "by root", "carol.txt": "carol"}
    assert machine.run("stat", "-c", "%U", f"{notes}/n.txt").stdout.strip() == BOB


def test_an_account_works_on_its_own_folder_with_its_groups(
    machine: Machine, bobs_home: str, alice_token: str
) -> None:
    real = f"/home/{ALICE}/proj"
    machine.run("rm", "-rf", real)
    machine.run("mkdir", "-p", real)
    machine.run("sh", "-c", f"printf mine > {real}/mine.txt && printf team > {real}/team.txt")
    machine.run("chown", "-R", f"{ALICE}:{ALICE}", real)
    # Readable by Alice only through her group; another that only root's group could read; and
    # a hard link to Bob's secret (root makes it: the kernel's protected_hardlinks keeps Alice
    # from linking a file she cannot read, but a box may run without it).
    machine.run("chown", f"{CAROL}:{TEAM}", f"{real}/team.txt")
    machine.run("chmod", "0640", f"{real}/team.txt")
    machine.run("sh", "-c", f"printf roots > {real}/roots.txt")
    machine.run("chown", f"{CAROL}:root", f"{real}/roots.txt")
    machine.run("chmod", "0640", f"{real}/roots.txt")
    machine.run("ln", f"{bobs_home}/secret.txt", f"{real}/linked.txt")
    task = start_fake(
        machine, alice_token, "sh ls; cat team.txt\nwrite mine.txt changed", folder=real
    )
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert ended["steps"][0]["text"] == "mine.txt\nteam.txt\nteam"
    assert not in_mirror(machine, task["workspace"], SECRET)
    status, diff = http(machine, "GET", f"/api/tasks/{task['id']}/diff", alice_token)
    assert status == 200 and [f["path"] for f in diff["files"]] == ["mine.txt"], diff
    kept = json.loads(boxctl(machine, "keep", task["id"], "--json", user=ALICE).stdout)
    assert kept["review"] == "kept"
    assert machine.run("cat", f"{real}/mine.txt").stdout == "changed"
    assert machine.run("stat", "-c", "%U", f"{real}/mine.txt").stdout.strip() == ALICE


def test_a_tasks_link_into_another_home_is_kept_as_a_link(
    machine: Machine, bobs_home: str, alice_token: str
) -> None:
    real = f"/home/{ALICE}/links"
    machine.run("rm", "-rf", real)
    machine.run("mkdir", "-p", real)
    machine.run("ln", "-s", f"{bobs_home}/.ssh", f"{real}/ssh")
    machine.run("chown", "-hR", f"{ALICE}:{ALICE}", real)
    task = start_fake(
        machine,
        alice_token,
        f"sh (printf '{ALICES_KEY}' > ssh/authorized_keys) 2>/dev/null || echo not through it\n"
        f"sh ln -s {bobs_home}/.ssh/authorized_keys keys && echo linked\n"
        "sh rm ssh && echo removed",
        folder=real,
    )
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["not through it", "linked", "removed"]
    status, kept = http(machine, "POST", f"/api/tasks/{task['id']}/keep", alice_token)
    assert (status, kept["review"]) == (200, "kept"), kept
    assert keys_of(machine) == f"{BOBS_KEY}\n"
    assert machine.run("readlink", f"{real}/keys").stdout.strip() == (
        f"{bobs_home}/.ssh/authorized_keys"
    )
    # The link the task removed is gone; what it pointed to is not.
    assert machine.run("ls", "-A", real).stdout.split() == ["keys"]


RECORD_WITHOUT_ASKER = (
    "import json, sqlite3, sys\n"
    "db = sqlite3.connect('/var/lib/box/box.db')\n"
    "(record,) = db.execute('SELECT record FROM tasks WHERE id = ?', (sys.argv[1],)).fetchone()\n"
    "task = json.loads(record)\n"
    "task.pop('askerUid', None)\n"
    "db.execute('UPDATE tasks SET record = ? WHERE id = ?', (json.dumps(task), sys.argv[1]))\n"
    "db.commit()\n"
)


def _as_recorded_before_askers(machine: Machine, *task_ids: str) -> None:
    """The tasks' records as boxd wrote them before it recorded the account that asked."""
    machine.run("systemctl", "stop", "boxd.service")
    for task_id in task_ids:
        machine.run("python3", "-c", RECORD_WITHOUT_ASKER, task_id)
    machine.run("systemctl", "start", "boxd.service")


def test_a_task_recorded_before_its_asker_is_kept_only_by_root(
    machine: Machine, alice_token: str
) -> None:
    real = f"/home/{ALICE}/older"
    machine.run("rm", "-rf", real)
    machine.run("mkdir", "-p", real)
    machine.run("sh", "-c", f"printf old > {real}/a.txt")
    machine.run("chown", "-R", f"{ALICE}:{ALICE}", real)
    done = start_fake(machine, alice_token, "write a.txt new", folder=real)
    assert finish(machine, done["id"])["review"] == "pending"
    boxctl(machine, "pause")
    try:
        queued = start_fake(machine, alice_token, "sh cat a.txt", folder=real)
        assert queued["state"] == "queued"
        _as_recorded_before_askers(machine, done["id"], queued["id"])
    finally:
        boxctl(machine, "resume")
    older = (
        f"task {done['id']} was asked for before boxd recorded which account asked: only root "
        "may keep it"
    )
    status, answer = http(machine, "POST", f"/api/tasks/{done['id']}/keep", alice_token)
    assert (status, answer) == (403, {"error": older})
    assert machine.run("cat", f"{real}/a.txt").stdout == "old"
    kept = json.loads(boxctl(machine, "keep", done["id"], "--json").stdout)
    assert kept["review"] == "kept"
    assert machine.run("stat", "-c", "%U", f"{real}/a.txt").stdout.strip() == ALICE
    # Not started: whoever asked, boxd does not know as whom to read the folder.
    ended = finish(machine, queued["id"])
    assert (ended["state"], ended["error"]) == (
        "failed",
        "The task could not start: it was asked for before boxd recorded which account asked, "
        "so its folders are not read for it; start it again",
    )
