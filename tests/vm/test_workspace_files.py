"""The workspace as it stands, read by its owner on a real box (busctl, boxctl, curl): tasks of
the fake worker leave an attacker's things in their layers (a link to /etc/shadow, a FIFO, a
name with terminal escapes, a file a later task replaces, one a later task deletes, a sparse
1 TB file); every read gives the right bytes, follows no link, refuses the FIFO without
hanging, and names the tasks newest first. An app's token limited to another workspace meets
the missing workspace's answer. A stranger flooding the manager and the web process with
file descriptors leaves them no more open files than before."""

import json
from typing import Any

import pytest

from testbed.box_api import API, boxctl, busctl_call, busctl_result, finish, http, start_fake
from testbed.bus_signals import PYTHON, as_stranger, main_pid
from testbed.machine import Machine

BASE = "/var/lib/box/workspaces/wf"
ESCAPED = "esc\x1b[2J\x1b]0;owned\x07name"
TERABYTE = 1 << 40
# A HEAD request on a connection the server closes after it, and all it sent until then.
RAW_HEAD = """
import socket, sys
with socket.create_connection(("127.0.0.1", 7700)) as connection:
    connection.sendall(
        f"HEAD {sys.argv[1]} HTTP/1.1\\r\\nHost: 127.0.0.1:7700\\r\\n"
        f"Authorization: Bearer {sys.argv[2]}\\r\\nConnection: close\\r\\n\\r\\n".encode()
    )
    got = b""
    while chunk := connection.recv(65536):
        got += chunk
sys.stdout.write(got.decode("latin-1"))
"""


@pytest.fixture(scope="module")
def tasks(machine: Machine, owner_token: str) -> tuple[str, str]:
    status, _ = http(machine, "POST", "/api/workspaces", owner_token, json.dumps({"name": "wf"}))
    assert status == 201
    machine.run(
        "sh", "-c", f"printf 'base\\n' > {BASE}/notes.md && printf 'bye\\n' > {BASE}/gone.md"
    )
    machine.run("chmod", "a+rw", f"{BASE}/notes.md", f"{BASE}/gone.md")
    first = start_fake(
        machine,
        owner_token,
        "\n".join(
            [
                "sh printf 'first\\n' > notes.md",
                "sh ln -s /etc/shadow shadow",
                "sh mkfifo pipe",
                "sh printf 'x\\n' > \"$(printf 'esc\\033[2J\\033]0;owned\\007name')\"",
                f"sh truncate -s {TERABYTE} sparse.bin",
            ]
        ),
        workspace="wf",
    )
    assert finish(machine, first["id"])["state"] == "done"
    second = start_fake(
        machine,
        owner_token,
        "sh printf 'second\\n' > notes.md\nsh rm gone.md",
        workspace="wf",
    )
    assert finish(machine, second["id"])["state"] == "done"
    return first["id"], second["id"]


def curl(machine: Machine, path: str, *options: str, token: str) -> tuple[dict[str, str], str]:
    """The answer's headers (lowercase names; `status`) and body."""
    done = machine.run(
        "curl",
        "-sS",
        "-D",
        "/dev/stderr",
        "-H",
        f"Authorization: Bearer {token}",
        *options,
        f"{API}{path}",
        timeout=60,
    )
    lines = done.stderr.strip().splitlines()
    headers = {"status": lines[0].split()[1]}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return headers, done.stdout


def listing(machine: Machine, owner: str) -> dict[str, dict[str, Any]]:
    answer = busctl_result(busctl_call(machine, "ListWorkspaceFiles", "wf", "", "", user=owner))
    return {entry["name"]: entry for entry in answer["entries"]}


def test_the_listing_names_the_tasks_and_follows_no_link(
    machine: Machine, owner: str, tasks: tuple[str, str]
) -> None:
    first, second = tasks
    entries = listing(machine, owner)
    assert set(entries) == {"notes.md", "shadow", "pipe", ESCAPED, "sparse.bin"}
    assert entries["notes.md"]["task"] == second and entries["shadow"]["task"] == first
    assert entries["shadow"]["kind"] == "link" and entries["shadow"]["target"] == "/etc/shadow"
    assert entries["pipe"]["kind"] == "other"
    assert entries["sparse.bin"]["size"] == TERABYTE
    shown = boxctl(machine, "ls", "wf", user=owner).stdout
    assert "\x1b" not in shown and "esc\\x1b[2J\\x1b]0;owned\\x07name" in shown
    assert "shadow -> /etc/shadow" in shown


def test_a_file_is_read_whole_and_a_link_or_fifo_refused(
    machine: Machine, owner: str, owner_token: str, tasks: tuple[str, str]
) -> None:
    assert boxctl(machine, "cat", "wf:notes.md", user=owner).stdout == "second\n"
    opened = busctl_call(machine, "OpenWorkspaceFile", "wf", "notes.md", user=owner)
    reply = json.loads(opened.stdout)
    assert reply["type"] == "hs" and json.loads(reply["data"][1])["task"] == tasks[1]
    for path, words in (("shadow", "a link, not a plain file"), ("pipe", "a FIFO")):
        refused = boxctl(machine, "cat", f"wf:{path}", user=owner, check=False, timeout=30)
        assert refused.returncode == 1 and words in refused.stderr
        headers, body = curl(machine, f"/api/workspaces/wf/files/{path}", token=owner_token)
        assert headers["status"] == "400" and words in json.loads(body)["error"]
    headers, body = curl(machine, "/api/workspaces/wf/files/notes.md", token=owner_token)
    assert headers["status"] == "200" and body == "second\n"
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["content-security-policy"] == "sandbox"
    missing, _ = curl(machine, "/api/workspaces/wf/files/gone.md", token=owner_token)
    assert missing["status"] == "404"


def test_ranges_of_a_sparse_terabyte_and_head(
    machine: Machine, owner_token: str, tasks: tuple[str, str]
) -> None:
    path = "/api/workspaces/wf/files/sparse.bin"
    headers, body = curl(machine, path, "-H", f"Range: bytes={TERABYTE - 6}-", token=owner_token)
    assert headers["status"] == "206" and body == "\0" * 6
    assert headers["content-range"] == f"bytes {TERABYTE - 6}-{TERABYTE - 1}/{TERABYTE}"
    assert headers["content-type"] == "application/octet-stream"
    assert headers["content-disposition"].startswith("attachment")
    for asked in (f"bytes={TERABYTE}-", "bytes=123456789012345678901-"):
        headers, _ = curl(machine, path, "-H", f"Range: {asked}", token=owner_token)
        assert headers["status"] == "416" and headers["content-range"] == f"bytes */{TERABYTE}"
    headers, _ = curl(machine, path, "-I", token=owner_token)
    assert headers["status"] == "200" and headers["content-length"] == str(TERABYTE)
    # What comes on the connection, to its end: the head alone, no byte of the terabyte.
    raw = machine.run(PYTHON, "-c", RAW_HEAD, path, owner_token, timeout=60).stdout
    head, _, after = raw.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 200") and after == ""


def test_history_is_newest_first_naming_tasks(
    machine: Machine, owner: str, owner_token: str, tasks: tuple[str, str]
) -> None:
    first, second = tasks
    status, history = http(machine, "GET", "/api/workspaces/wf/history/notes.md", owner_token)
    assert status == 200
    assert [(t["task"], t["change"]) for t in history["tasks"]] == [
        (second, "changed"),
        (first, "changed"),
    ]
    assert history["inBase"] is True
    gone = busctl_result(
        busctl_call(machine, "GetWorkspaceFileHistory", "wf", "gone.md", user=owner)
    )
    assert [(t["task"], t["change"]) for t in gone["tasks"]] == [(second, "deleted")]
    shown = boxctl(machine, "history", "wf:notes.md", user=owner).stdout.splitlines()
    assert shown[0].startswith(second) and shown[1].startswith(first)
    assert shown[2].startswith("base")


def test_a_token_limited_to_another_workspace_meets_a_missing_one(
    machine: Machine, owner: str, tasks: tuple[str, str]
) -> None:
    token = boxctl(
        machine, "token", "create", "--app", "--name", "reader", "--workspace", "home", user=owner
    ).stdout.strip()
    for path in ("list", "files/notes.md", "history/notes.md"):
        outside = http(machine, "GET", f"/api/workspaces/wf/{path}", token)
        absent = http(machine, "GET", f"/api/workspaces/nothing/{path}", token)
        assert outside[0] == absent[0] == 404
        assert outside[1]["error"].replace("wf", "nothing") == absent[1]["error"]
    assert http(machine, "GET", "/api/workspaces/home/list", token)[0] == 200


def open_fds(machine: Machine, pid: int) -> int:
    return len(machine.run("ls", f"/proc/{pid}/fd").stdout.split())


def test_a_strangers_descriptors_do_not_stay_open(
    machine: Machine, owner: str, owner_token: str
) -> None:
    # Both take descriptors: the manager and the web process (started by a first request).
    assert http(machine, "GET", "/api/workspaces", owner_token)[0] == 200
    for unit in ("boxd.service", "boxd-web.service"):
        pid = main_pid(machine, unit)
        assert pid != 0, unit
        before = open_fds(machine, pid)
        as_stranger(machine, "flood", f"pid:{pid}", "300")
        # Answers that come on each one's connection after the flood, which the bus delivers
        # in order: every message of the flood was handled by then.
        busctl_call(machine, "ListWorkspaces", user=owner)
        assert http(machine, "GET", "/api/workspaces", owner_token)[0] == 200
        after = open_fds(machine, pid)
        assert after < before + 10, f"{unit}: {before} open files before, {after} after"
