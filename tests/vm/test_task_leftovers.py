"""Nothing a task leaves in a workspace runs in another task's worker, and a task's only voices
are its broker and its output: tried by tasks playing the attacker, in a real box.

The fake worker's `write` puts a file in the task's view as the task's user, as any agent could;
`sh` runs a command inside the worker's unit.
"""

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.box_api import boxctl, finish, http, start_fake, wait_for_step
from testbed.machine import Machine

SITE = ".local/lib/python3.11/site-packages"


@pytest.fixture
def running(machine: Machine, token: str) -> Iterator[dict[str, Any]]:
    """Another task, whose worker sleeps; stopped afterwards."""
    task = start_fake(machine, token, "step up\nsleep 120")
    wait_for_step(machine, task["id"])
    yield task
    http(machine, "POST", f"/api/tasks/{task['id']}/stop", token)


def _plant(name: str) -> str:
    """One line of Python that says what ran it on stderr, which the journal keeps even when
    the task fails and its layer is thrown away, and leaves a file named for it."""
    return (
        f"import os, sys; print('ran-{name}', file=sys.stderr, flush=True); "
        f"open(os.path.join(os.getcwd(), 'ran-{name}'), 'w').close()"
    )


# Where a Python that starts in the view, with HOME in it, would pick code up: the user's
# site-packages (usercustomize, sitecustomize, .pth lines that start with `import`), and the
# working directory, first on sys.path for `python -m` (a module the worker imports by name).
PLANTS = {
    f"{SITE}/usercustomize.py": _plant("usercustomize"),
    f"{SITE}/sitecustomize.py": _plant("sitecustomize"),
    f"{SITE}/leftover.pth": _plant("pth"),
    "json.py": _plant("json"),
}


def test_nothing_a_task_leaves_runs_when_the_next_worker_starts(
    machine: Machine, token: str
) -> None:
    workspace = "leftovers"
    boxctl(machine, "workspace", "create", workspace)
    planter = start_fake(
        machine,
        token,
        "\n".join(f"write {path} {code}" for path, code in PLANTS.items()),
        workspace=workspace,
    )
    assert finish(machine, planter["id"])["state"] == "done"
    layers = f"/var/lib/box/layers/{workspace}"
    planted = machine.run("sh", "-c", f"cd {layers} && find . -type f | sort").stdout
    assert len(planted.split()) == len(PLANTS), planted
    # The next task on the same workspace sees those files in its view, and starts.
    victim = start_fake(
        machine,
        token,
        f"sh ls -a {SITE}\nsh cat {SITE}/usercustomize.py",
        workspace=workspace,
    )
    ended = finish(machine, victim["id"])
    # Nothing of it ran in the worker: nothing it would have said, no file it would have left.
    machine.run("journalctl", "--sync")
    said = machine.run(
        "journalctl", "--no-pager", "-o", "cat", "-u", f"box-task-{victim['id']}.service"
    ).stdout
    assert "ran-" not in said, said
    ran = machine.run("find", "/var/lib/box", "/tmp", "-name", "ran-*").stdout
    assert ran == "", ran
    assert ended["state"] == "done", ended
    assert ended["steps"][0]["text"].split() == [
        ".",
        "..",
        "leftover.pth",
        "sitecustomize.py",
        "usercustomize.py",
    ]
    assert ended["steps"][1]["text"] == _plant("usercustomize")


def test_the_workers_home_and_caches_are_its_own_and_go_with_it(
    machine: Machine, token: str
) -> None:
    task = start_fake(
        machine,
        token,
        'sh printf \'%s\\n\' "$HOME" "$XDG_CACHE_HOME" "$XDG_CONFIG_HOME"\n'
        'sh mkdir -p "$XDG_CACHE_HOME" && echo cached > "$XDG_CACHE_HOME/probe" '
        '&& stat -c "%U %a" "$HOME"\n'
        "sleep 120",
    )
    wait_for_step(machine, task["id"], count=2)
    own = f"/var/lib/box/tasks/{task['id']}/home"
    assert machine.run("cat", f"{own}/.cache/probe").stdout == "cached\n"
    http(machine, "POST", f"/api/tasks/{task['id']}/stop", token)
    ended = finish(machine, task["id"])
    where, owner = (s["text"] for s in ended["steps"][:2])
    assert where.splitlines() == [own, f"{own}/.cache", f"{own}/.config"]
    assert owner == f"box-{task['id']} 700"
    # Not in the workspace, and gone once the task has ended.
    assert machine.run("test", "-e", own, check=False).returncode == 1
    found = machine.run("find", "/var/lib/box/workspaces", "/var/lib/box/layers", "-name", "probe")
    assert found.stdout == ""


def _journal_entries(machine: Machine, *matches: str) -> list[dict[str, Any]]:
    shown = machine.run("journalctl", "--no-pager", "-o", "json", *matches).stdout
    return [json.loads(line) for line in shown.splitlines() if line.startswith("{")]


# Every socket file the task can find (by stat: find's -type trusts the directory entry, which
# for a file bound over a mount point is the point's), then every one it can connect to, of
# those and of the paths it is given.
PROBE = """
import os, socket, stat, sys
found = []
for top, folders, files in os.walk("/"):
    if top == "/":
        folders[:] = [f for f in folders if f not in ("proc", "sys")]
    for name in files:
        path = os.path.join(top, name)
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                found.append(path)
        except OSError:
            pass
for path in found:
    print("found", path)
for path in sorted(set(found + sys.argv[1:])):
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):
        s = socket.socket(socket.AF_UNIX, kind)
        try:
            s.connect(path)
        except OSError:
            continue
        finally:
            s.close()
        print("reached", path)
        break
"""

REFUSED = "2>/dev/null && echo {0} reached || echo {0} refused"


def test_a_task_cannot_write_the_journal_as_boxd(
    machine: Machine, token: str, running: dict[str, Any]
) -> None:
    victim = running["id"]
    forged = (
        "printf 'MESSAGE=approved by the owner\\nBOX_TASK=%s\\nBOX_EVENT=approval\\n"
        f"FORGED_BY=attacker\\n' {victim} | logger --journald {REFUSED.format('journald')}; "
        # The syslog socket and systemd-cat's stream socket are journald's too.
        "logger --socket-errors=on -t forged-by-attacker forged "
        f"{REFUSED.format('syslog')}; "
        f"systemd-cat -t forged-by-attacker echo forged {REFUSED.format('stream')}"
    )
    attacker = start_fake(machine, token, f"sh {forged}")
    ended = finish(machine, attacker["id"])
    assert ended["state"] == "done", ended
    # sd_journal_send drops a message when journald's socket is not there and says it sent it,
    # so `logger --journald` looks happy: the journal below is what counts.
    assert ended["steps"][0]["text"].splitlines()[1:] == ["syslog refused", "stream refused"]
    machine.run("journalctl", "--sync")
    assert _journal_entries(machine, "FORGED_BY=attacker") == []
    assert _journal_entries(machine, "SYSLOG_IDENTIFIER=forged-by-attacker") == []
    told = _journal_entries(machine, f"BOX_TASK={victim}")
    assert told, "boxd's own lines about the task are there"
    assert not [e for e in told if "approved by the owner" in str(e.get("MESSAGE"))], told


def test_a_task_reaches_no_socket_but_its_brokers(
    machine: Machine, token: str, running: dict[str, Any]
) -> None:
    # The box's sockets, as root sees them: the journal's, the bus's, systemd's, another task's.
    theirs = machine.run(
        "sh", "-c", "find /run /var/lib/box /dev -type s 2>/dev/null | sort"
    ).stdout.split()
    assert "/run/systemd/journal/socket" in theirs
    assert f"/var/lib/box/tasks/{running['id']}/broker.sock" in theirs
    task = start_fake(
        machine,
        token,
        f"sh python3 probe.py {' '.join(theirs)} /dev/log $BOX_SOCKET",
        files=[{"name": "probe.py", "content": base64.b64encode(PROBE.encode()).decode()}],
    )
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    door = f"/var/lib/box/tasks/{task['id']}/broker.sock"
    printed = ended["steps"][0]["text"].splitlines()
    assert printed == [f"found {door}", f"reached {door}"]


def test_the_workers_output_still_reaches_the_journal(machine: Machine, token: str) -> None:
    task = start_fake(machine, token, "step first\nfail hello from the worker")
    ended = finish(machine, task["id"])
    assert ended["state"] == "failed", ended
    machine.run("journalctl", "--sync")
    said = machine.run(
        "journalctl", "--no-pager", "-o", "cat", "-u", f"box-task-{task['id']}.service"
    ).stdout
    assert "line 2: hello from the worker" in said, said


def test_git_trusts_no_repository_another_task_wrote(machine: Machine, token: str) -> None:
    """A repository left in the workspace whose config runs commands (an fsmonitor, an external
    diff): git in the next task refuses it, for its files belong to the task that wrote them, a
    user the next task is not. That check is what guards the agents that run `git status` and
    `git diff` without asking (docs/agents.md); the box never sets safe.directory."""
    workspace = "leftover-repo"
    boxctl(machine, "workspace", "create", workspace)
    trap = "touch /tmp/ran-git; false"
    planter = start_fake(
        machine,
        token,
        "sh git init -q repo && cd repo && echo a > a.txt && git add a.txt && "
        f"git config core.fsmonitor '{trap}' && git config diff.external '{trap}' && "
        "echo b > a.txt && git status --short; ls /tmp",
        workspace=workspace,
    )
    planted = finish(machine, planter["id"])
    assert planted["state"] == "done", planted
    # The trap works: in the repository's own user's hands, git ran it.
    assert "ran-git" in planted["steps"][0]["text"], planted["steps"]
    victim = start_fake(
        machine,
        token,
        "sh cd repo && git status 2>&1; git diff 2>&1; ls /tmp; true",
        workspace=workspace,
    )
    ended = finish(machine, victim["id"])
    assert ended["state"] == "done", ended
    said = ended["steps"][0]["text"]
    assert "dubious ownership" in said, said
    assert "ran-git" not in said, said
    assert machine.run("find", "/var/lib/box", "/tmp", "-name", "ran-git").stdout == ""
