"""A workspace downloaded whole as a tar on a real box: tasks of the fake worker leave an
attacker's things in their layers (a link to /etc/shadow, a FIFO, a name with terminal escapes,
a sparse 1 TB file, a folder and a file a later task deletes); the owner downloads it with curl
and extracts it with the system's GNU tar, and gets it with `boxctl get`. The contents are the
workspace as it stands, nothing lands outside the folder, the deletions hold, the FIFO is not
there and the terabyte arrives as the few bytes it holds, sparse. An app's token limited to
another workspace meets the missing workspace's answer."""

import json

import pytest

from testbed.box_api import API, BOXCTL, boxctl, finish, http, start_fake
from testbed.machine import Machine

BASE = "/var/lib/box/workspaces/wa"
ESCAPED = "esc\x1b[2J\x1b]0;owned\x07name"
TERABYTE = 1 << 40
# What the owner's folder holds after either download: path -> content (None: a folder).
WANT = {
    "notes.md": "second\n",
    "docs": None,
    "docs/a.md": "a\n",
    ESCAPED: "x\n",
}
# Lists what is under a folder, NUL-separated: type, size, blocks, owner and path (or target).
FIND = "find . -mindepth 1 -printf '%y %s %b %u %P -> %l\\0' | sort -z"


@pytest.fixture(scope="module")
def tasks(machine: Machine, owner_token: str) -> tuple[str, str]:
    status, _ = http(machine, "POST", "/api/workspaces", owner_token, json.dumps({"name": "wa"}))
    assert status == 201
    machine.run(
        "sh",
        "-c",
        f"printf 'base\\n' > {BASE}/notes.md && printf 'bye\\n' > {BASE}/gone.md "
        f"&& mkdir {BASE}/old && printf 'old\\n' > {BASE}/old/kept.md && chmod -R a+rwX {BASE}",
    )
    first = start_fake(
        machine,
        owner_token,
        "\n".join(
            [
                "sh printf 'first\\n' > notes.md",
                "sh ln -s /etc/shadow shadow",
                "sh mkfifo pipe",
                "sh printf 'x\\n' > \"$(printf 'esc\\033[2J\\033]0;owned\\007name')\"",
                f"sh truncate -s {TERABYTE} sparse.bin && printf end >> sparse.bin",
                "sh mkdir docs && printf 'a\\n' > docs/a.md && ln -s a.md docs/here",
            ]
        ),
        workspace="wa",
    )
    assert finish(machine, first["id"])["state"] == "done"
    second = start_fake(
        machine,
        owner_token,
        "sh printf 'second\\n' > notes.md\nsh rm -r gone.md old",
        workspace="wa",
    )
    assert finish(machine, second["id"])["state"] == "done"
    return first["id"], second["id"]


def found(machine: Machine, folder: str, user: str) -> dict[str, list[str]]:
    listed = machine.run("sh", "-c", f"cd {folder} && {FIND}", user=user).stdout
    entries = {}
    for line in filter(None, listed.split("\0")):
        kind, size, blocks, who, rest = line.split(" ", 4)
        path, _, target = rest.rpartition(" -> ")
        entries[path] = [kind, size, blocks, who, target]
    return entries


def check_contents(machine: Machine, folder: str, user: str, links: set[str]) -> None:
    entries = found(machine, folder, user)
    assert set(entries) == {*WANT, "sparse.bin", *links}
    for path, content in WANT.items():
        assert entries[path][3] == user
        if content is not None:
            read = machine.run("cat", f"{folder}/{path}", user=user).stdout
            assert read == content, path
    kind, size, blocks, _, _ = entries["sparse.bin"]
    assert kind == "f" and int(size) == TERABYTE + 3 and int(blocks) * 512 < 1 << 20
    tail = machine.run("tail", "-c", "3", f"{folder}/sparse.bin", user=user).stdout
    assert tail == "end"
    assert entries["docs/here"][0] == "l" and entries["docs/here"][4] == "a.md"


def test_curl_downloads_it_and_tar_extracts_the_workspace_as_it_stands(
    machine: Machine, owner: str, owner_token: str, tasks: tuple[str, str]
) -> None:
    home = f"/home/{owner}"
    machine.run("rm", "-rf", f"{home}/curl")
    machine.run("mkdir", f"{home}/curl", user=owner)
    machine.run(
        "curl",
        "-sS",
        "-D",
        f"{home}/curl/headers",
        "-o",
        f"{home}/curl/wa.tar",
        "-H",
        f"Authorization: Bearer {owner_token}",
        f"{API}/api/workspaces/wa/archive",
        user=owner,
        timeout=120,
    )
    headers = machine.run("cat", f"{home}/curl/headers").stdout.lower()
    assert "200" in headers.splitlines()[0]
    assert "content-type: application/x-tar" in headers
    assert 'content-disposition: attachment; filename="wa.tar"' in headers
    # The terabyte is a line of the sparse map and its three bytes, not a terabyte of zeros.
    size = int(machine.run("stat", "-c", "%s", f"{home}/curl/wa.tar").stdout)
    assert size < 1 << 20
    machine.run("tar", "-xf", f"{home}/curl/wa.tar", "-C", f"{home}/curl", user=owner)
    machine.run("rm", f"{home}/curl/wa.tar", f"{home}/curl/headers")
    assert machine.run("ls", f"{home}/curl", user=owner).stdout.split() == ["wa"]
    # GNU tar makes the link as a link (its target is text); nothing of /etc/shadow came.
    check_contents(machine, f"{home}/curl/wa", owner, {"docs/here", "shadow"})
    assert found(machine, f"{home}/curl/wa", owner)["shadow"][4] == "/etc/shadow"


def test_boxctl_get_extracts_it_as_the_owners_own_files(
    machine: Machine, owner: str, tasks: tuple[str, str]
) -> None:
    home = f"/home/{owner}"
    machine.run("rm", "-rf", f"{home}/got", f"{home}/a.md")
    got = machine.run("sh", "-c", f"cd {home} && {BOXCTL} get wa got", user=owner, timeout=120)
    assert "left out link 'shadow' -> '/etc/shadow': it leads out of the folder" in got.stdout
    assert "\x1b" not in got.stdout
    check_contents(machine, f"{home}/got", owner, {"docs/here"})
    again = machine.run(
        "sh", "-c", f"cd {home} && {BOXCTL} get wa got", user=owner, check=False, timeout=60
    )
    assert again.returncode == 1 and "is there already" in again.stderr
    assert "--force" in again.stderr
    # A file, into the current folder under its own name.
    machine.run("sh", "-c", f"cd {home} && {BOXCTL} get wa:docs/a.md", user=owner, timeout=60)
    assert machine.run("cat", f"{home}/a.md", user=owner).stdout == "a\n"
    # A folder of it, by the same door.
    machine.run(
        "sh", "-c", f"cd {home} && rm -rf docs && {BOXCTL} get wa:docs", user=owner, timeout=60
    )
    assert machine.run("cat", f"{home}/docs/a.md", user=owner).stdout == "a\n"
    refused = boxctl(machine, "get", "wa:pipe", "/tmp/p", user=owner, check=False, timeout=60)
    assert refused.returncode == 1 and "a FIFO" in refused.stderr


def test_a_folder_of_it_and_a_token_limited_to_another_workspace(
    machine: Machine, owner: str, owner_token: str, tasks: tuple[str, str]
) -> None:
    headers = machine.run(
        "curl",
        "-sS",
        "-D",
        "/dev/stdout",
        "-o",
        "/dev/null",
        "-H",
        f"Authorization: Bearer {owner_token}",
        f"{API}/api/workspaces/wa/archive/docs",
        timeout=60,
    ).stdout.lower()
    assert 'filename="wa-docs.tar"' in headers
    token = boxctl(
        machine, "token", "create", "--app", "--name", "tarrer", "--workspace", "home", user=owner
    ).stdout.strip()
    outside = http(machine, "GET", "/api/workspaces/wa/archive", token)
    absent = http(machine, "GET", "/api/workspaces/nothing/archive", token)
    assert outside[0] == absent[0] == 404
    assert outside[1]["error"].replace("wa", "nothing") == absent[1]["error"]
    for path, status in (("notes.md", 400), ("gone.md", 404), ("old", 404)):
        assert http(machine, "GET", f"/api/workspaces/wa/archive/{path}", owner_token)[0] == status
