"""Files at rest: another user of the box (here `nobody`) reads nothing boxd keeps. The record
(every prompt, step and tool output), the workspaces' bases, files shared to a task, the layers
of done tasks and a running task's view and home are each tried."""

import base64

from testbed.box_api import boxctl, finish, http, start_fake, wait_for_step
from testbed.machine import Machine

BOX = "/var/lib/box"


def _unreadable(machine: Machine, path: str) -> str:
    """What `nobody` gets for reading `path` (a file, or a folder's listing)."""
    assert machine.run("test", "-e", path, check=False).returncode == 0, f"{path} is not there"
    tried = machine.run(
        "sh",
        "-c",
        f'if [ -d "{path}" ]; then ls "{path}"; else cat "{path}"; fi',
        user="nobody",
        check=False,
    )
    assert tried.returncode != 0, (path, tried.stdout)
    return tried.stderr


def test_other_users_read_nothing_boxd_keeps(machine: Machine, token: str) -> None:
    boxctl(machine, "workspace", "create", "private")
    machine.run("sh", "-c", f"echo the owner notes > {BOX}/workspaces/private/notes.txt")
    machine.run("chmod", "0644", f"{BOX}/workspaces/private/notes.txt")
    done = start_fake(machine, token, "write layer.txt a done task's work", workspace="private")
    assert finish(machine, done["id"])["state"] == "done"
    layer = machine.run("sh", "-c", f"ls {BOX}/layers/private/*/layer.txt").stdout.strip()
    shared = start_fake(
        machine,
        token,
        "step got it",
        files=[{"name": "shared.txt", "content": base64.b64encode(b"shared with it").decode()}],
    )
    assert finish(machine, shared["id"])["state"] == "done"
    running = start_fake(
        machine,
        token,
        'write mine.txt in its view\nsh echo cached > "$HOME/cache.txt"\nsleep 120',
    )
    wait_for_step(machine, running["id"], count=2)
    own = f"{BOX}/tasks/{running['id']}"
    try:
        machine.run("systemctl", "restart", "boxd.service")
        targets = [
            f"{BOX}/box.db",
            f"{BOX}/box.db-wal",
            f"{BOX}/box.db-shm",
            f"{BOX}/workspaces/private/notes.txt",
            f"{BOX}/workspaces/private",
            f"{BOX}/workspaces",
            f"{BOX}/workspaces/files-{shared['id']}/shared.txt",
            layer,
            f"{BOX}/layers",
            f"{own}/work/mine.txt",
            f"{own}/work",
            f"{own}/upper/mine.txt",
            f"{own}/home/cache.txt",
            f"{BOX}/tasks",
        ]
        for path in targets:
            assert "Permission denied" in _unreadable(machine, path), path
        record = [f"{BOX}/box.db{end}" for end in ("", "-wal", "-shm")]
        modes = machine.run("stat", "-c", "%n %a", *record).stdout.splitlines()
        assert modes == [f"{path} 600" for path in record]
        gates = machine.run(
            "stat",
            "-c",
            "%n %a %U:%G",
            f"{BOX}/workspaces",
            f"{BOX}/workspaces/private",
            f"{BOX}/layers",
            f"{BOX}/tasks",
        ).stdout.splitlines()
        assert gates == [
            f"{BOX}/workspaces 750 root:boxd-work",
            f"{BOX}/workspaces/private 2770 root:boxd-work",
            f"{BOX}/layers 700 root:root",
            f"{BOX}/tasks 711 root:root",
        ]
    finally:
        http(machine, "POST", f"/api/tasks/{running['id']}/stop", token)
