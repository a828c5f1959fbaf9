"""Personal folders in a machine, as VM tests make and read them: an owner's token, a folder, a tree
of files, keeping a task's layer."""

from typing import Any

import pytest

from testbed.box_api import boxctl, http
from testbed.machine import Machine


@pytest.fixture(scope="module")
def owner_token(machine: Machine, owner: str) -> str:
    """A token the owner made: personal folders must be in that account's home."""
    return boxctl(machine, "token", "create", "--name", "owner's phone", user=owner).stdout.strip()


def folder(machine: Machine, owner: str, name: str, files: dict[str, str]) -> str:
    """A real folder of the owner's, with files, owned by the owner."""
    path = f"/home/{owner}/{name}"
    machine.run("rm", "-rf", path)
    machine.run("mkdir", "-p", path)
    for file, text in files.items():
        machine.run(
            "sh",
            "-c",
            'mkdir -p "$(dirname "$1")" && printf %s "$2" > "$1"',
            "-",
            f"{path}/{file}",
            text,
        )
    machine.run("chown", "-R", f"{owner}:{owner}", path)
    return path


def tree(machine: Machine, path: str) -> dict[str, str]:
    """Every file under path with its contents."""
    listed = machine.run(
        "sh",
        "-c",
        'cd "$1" && find . -type f | sort | while read f; do echo "$f=$(cat "$f")"; done',
        "-",
        path,
    ).stdout
    return dict(line[2:].split("=", 1) for line in listed.splitlines())


def keep(machine: Machine, token: str, task_id: str) -> tuple[int, Any]:
    return http(machine, "POST", f"/api/tasks/{task_id}/keep", token)
