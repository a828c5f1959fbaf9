"""The review of a task's changes (boxd/manager/workspaces/diffs.py), on temp folders standing for a
task's layer and the layers below it. Overlayfs's own marks (a 0/0 character device, a trusted.*
xattr) need root: here a whiteout is an empty sticky file and an opaque folder one with a user.*
xattr, through the Marks seam. The attacker's cases come first."""

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from boxd.cli import show
from boxd.dbus import interface as api
from boxd.dbus.client import GatewayClient
from boxd.dbus.interface import GATEWAY, Method, bound_on
from boxd.errors import BoxError, Problem, die
from boxd.manager.workspaces import diffs, text_diff
from boxd.manager.workspaces.diffs import KEEP_SKIPS, diff_page, shown_name
from boxd.manager.workspaces.text_diff import unified
from boxd.reading.strict_json import size
from boxd.web.app import make_app
from boxd.wire.caller import OWNER_ONLY, Role
from boxd.wire.models.task_diff import MAX_DIFF_FILES, MAX_DIFF_READ, MAX_DIFF_TEXT, FileChange
from tests.support.layer_marks import MARKS, OPAQUE, delete, write


@pytest.fixture
def layers(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The task's layer, one layer below it and the base."""
    made = tmp_path / "layer", tmp_path / "below", tmp_path / "base"
    for path in made:
        path.mkdir()
    return made


def review(layers: tuple[Path, Path, Path], personal: bool = False) -> dict[str, dict[str, Any]]:
    layer, below, base = layers
    page = diff_page(layer, [below, base], "", personal, MARKS)
    assert page.next is None and not page.truncated
    for item in page.files:
        FileChange.model_validate(item)
        json.dumps(item)  # every answer goes out as JSON
    return {item["path"]: item for item in page.files}


# The attacker's cases.


def test_a_link_to_etc_shadow_is_named_never_followed(layers: tuple[Path, Path, Path]) -> None:
    layer, _, base = layers
    (layer / "secret").symlink_to("/etc/shadow")
    write(base, "inside/a.txt", "mine\n")
    (layer / "inside").symlink_to("/etc")  # a folder the task swapped for a link
    found = review(layers)
    assert found["secret"] == {
        "path": "secret",
        "change": "added",
        "kind": "link",
        "target": "/etc/shadow",
    }
    assert found["inside"] == {
        "path": "inside",
        "change": "changed",
        "kind": "link",
        "oldKind": "dir",
        "target": "/etc",
    }
    # What was in the folder is gone from the task's view: read from below, never through /etc.
    assert found["inside/a.txt"]["change"] == "deleted"
    assert (
        found["inside/a.txt"]["diff"] == "--- a/inside/a.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-mine\n"
    )
    assert "root:" not in json.dumps(found)


def test_a_fifo_is_named_and_never_opened(layers: tuple[Path, Path, Path]) -> None:
    layer, _, _ = layers
    os.mkfifo(layer / "pipe")
    found = review(layers, personal=True)
    assert found["pipe"] == {
        "path": "pipe",
        "change": "added",
        "kind": "other",
        "skipped": KEEP_SKIPS,
    }


def test_a_fifo_put_where_a_file_was_listed_is_not_read(
    layers: tuple[Path, Path, Path],
) -> None:
    """A running task swaps a file for a FIFO between the listing and the read: opened with
    O_NONBLOCK and refused by fstat, never waited on."""
    layer, _, _ = layers
    write(layer, "note.txt", "hello\n")
    entry = diffs._Entry("note.txt", (layer / "note.txt").lstat(), None)
    (layer / "note.txt").unlink()
    os.mkfifo(layer / "note.txt")
    root = os.open(layer, os.O_RDONLY | os.O_DIRECTORY)
    answers: list[dict[str, Any]] = []
    try:
        # A daemon: if the read ever blocks, the test fails instead of hanging.
        reading = threading.Thread(
            target=lambda: answers.append(diffs.describe(entry, root, False)), daemon=True
        )
        reading.start()
        reading.join(10)
        assert not reading.is_alive(), "reading a FIFO blocked"
    finally:
        os.close(root)
    assert answers[0]["notShown"] == "it is no longer a plain file"
    assert "diff" not in answers[0]


def test_a_100_mb_file_is_not_read(layers: tuple[Path, Path, Path]) -> None:
    layer, _, base = layers
    write(base, "big.log", "small\n")
    with (layer / "big.log").open("wb") as handle:
        handle.truncate(100 * 1024 * 1024)  # sparse: 100 MB that takes no room
    found = review(layers)
    assert found["big.log"] == {
        "path": "big.log",
        "change": "changed",
        "kind": "file",
        "tooLarge": True,
        "size": 100 * 1024 * 1024,
        "oldSize": 6,
    }


def test_a_file_that_grows_past_the_cap_after_the_listing_is_not_read_whole(
    layers: tuple[Path, Path, Path],
) -> None:
    layer, _, _ = layers
    write(layer, "grows", "x")
    entry = diffs._Entry("grows", (layer / "grows").lstat(), None)
    write(layer, "grows", b"y" * (MAX_DIFF_READ + 10))
    root = os.open(layer, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert diffs.describe(entry, root, False)["tooLarge"] is True
    finally:
        os.close(root)


def test_escapes_in_names_and_contents_go_out_as_they_are(
    layers: tuple[Path, Path, Path],
) -> None:
    """The answer carries them (JSON escapes them); boxctl shows them visible (test_show)."""
    layer, _, _ = layers
    name = "\x1b]0;owned\x07\x1b[2J.txt"
    write(layer, name, "\x1b[31mred\r\n")
    found = review(layers)
    assert found[name]["diff"] == (f"--- /dev/null\n+++ b/{name}\n@@ -0,0 +1 @@\n+\x1b[31mred\r\n")


def test_a_name_that_is_not_utf8_is_shown_and_said(layers: tuple[Path, Path, Path]) -> None:
    layer, _, _ = layers
    (layer / os.fsdecode(b"caf\xe9.txt")).write_text("x\n")
    found = review(layers)
    assert found["caf\\xe9.txt"]["nameNotUtf8"] is True
    assert found["caf\\xe9.txt"]["diff"].startswith("--- /dev/null\n+++ b/caf\\xe9.txt\n")
    assert shown_name("plain") == ("plain", False)


def test_a_binary_file_is_named_as_such(layers: tuple[Path, Path, Path]) -> None:
    layer, _, base = layers
    write(layer, "image.png", b"\x89PNG\r\n\x1a\n\x00\x00")
    write(base, "latin.txt", "caf\xe9\n".encode("latin-1"))
    write(layer, "latin.txt", "cafe\n")
    found = review(layers)
    assert found["image.png"] == {
        "path": "image.png",
        "change": "added",
        "kind": "file",
        "binary": True,
        "size": 10,
    }
    assert found["latin.txt"]["binary"] is True and "diff" not in found["latin.txt"]


def test_deletions_of_files_folders_and_a_replaced_folder(
    layers: tuple[Path, Path, Path],
) -> None:
    layer, below, base = layers
    write(base, "gone.txt", "bye\n")
    write(base, "old/one.txt", "1\n")
    write(below, "old/two.txt", "2\n")
    write(base, "redo/keep.txt", "k\n")
    write(base, "redo/lost.txt", "l\n")
    delete(layer, "gone.txt")
    delete(layer, "old")
    delete(layer, "never-there")  # a whiteout over nothing is no change
    write(layer, "redo/keep.txt", "k2\n")
    os.setxattr(layer / "redo", OPAQUE, b"y")
    found = review(layers)
    assert set(found) == {
        "gone.txt",
        "old",
        "old/one.txt",
        "old/two.txt",
        "redo/keep.txt",
        "redo/lost.txt",
    }
    assert found["gone.txt"]["diff"] == "--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"
    assert (found["old"]["change"], found["old"]["kind"]) == ("deleted", "dir")
    assert found["old/two.txt"]["diff"].endswith("-2\n")
    assert found["redo/lost.txt"]["change"] == "deleted"
    assert found["redo/keep.txt"]["change"] == "changed"


def test_the_layer_below_wins_over_the_base_and_a_whiteout_there_hides_it(
    layers: tuple[Path, Path, Path],
) -> None:
    layer, below, base = layers
    write(base, "a.txt", "base\n")
    write(below, "a.txt", "below\n")
    write(layer, "a.txt", "task\n")
    write(base, "b.txt", "base\n")
    delete(below, "b.txt")  # an earlier task deleted it: the task made it anew
    write(layer, "b.txt", "task\n")
    found = review(layers)
    assert "-below\n+task\n" in found["a.txt"]["diff"]
    assert found["b.txt"]["change"] == "added"


def test_an_added_folder_and_its_files_a_changed_file_and_no_newline(
    layers: tuple[Path, Path, Path],
) -> None:
    layer, _, base = layers
    write(base, "notes.md", "one\ntwo\nthree")
    write(layer, "notes.md", "one\n2\nthree")
    write(layer, "new/deep/x.txt", "x\n")
    (base / "same").mkdir()
    write(layer, "same/y.txt", "y\n")
    found = review(layers)
    assert list(found) == ["new", "new/deep", "new/deep/x.txt", "notes.md", "same/y.txt"]
    assert found["new"] == {"path": "new", "change": "added", "kind": "dir"}
    assert found["notes.md"]["diff"] == (
        "--- a/notes.md\n+++ b/notes.md\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n"
        "\\ No newline at end of file\n"
    )


def test_a_long_diff_is_cut_at_a_line(layers: tuple[Path, Path, Path]) -> None:
    layer, _, _ = layers
    write(layer, "long.txt", "".join(f"line {n}\n" for n in range(60_000)))
    item = review(layers)["long.txt"]
    assert item["truncated"] is True
    assert len(item["diff"]) <= MAX_DIFF_TEXT and item["diff"].endswith("\n")
    assert unified("x", b"a\n", b"b\n") == ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", False)


def test_lines_split_only_at_newlines() -> None:
    assert unified("x", None, b"a\rb\x0cc\n")[0] == (
        "--- /dev/null\n+++ b/x\n@@ -0,0 +1 @@\n+a\rb\x0cc\n"
    )


def test_a_newline_in_a_name_cannot_forge_a_line_of_the_diff() -> None:
    text, _ = unified("a\n+++ b/etc/passwd", None, b"x\n")
    assert text.splitlines()[:2] == ["--- /dev/null", "+++ b/a\\n+++ b/etc/passwd"]


def test_a_diff_that_takes_too_long_is_stopped_and_said(
    layers: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A diff that never ends in time stands in for GNU diff: how long the real one takes hangs
    # on the machine (90,000 shuffled lines took it over 0.01 s on a loaded machine and under
    # it on a quiet one, where this test then failed), and what is tested is boxd's stop.
    never_done = tmp_path / "never-done-diff"
    never_done.write_text("#!/bin/sh\nexec sleep 600\n")
    never_done.chmod(0o755)
    monkeypatch.setattr(text_diff, "DIFF", str(never_done))
    monkeypatch.setattr(text_diff, "MAX_DIFF_SECONDS", 0.2)
    layer, _, base = layers
    write(base, "slow.txt", "old\n")
    write(layer, "slow.txt", "new\n")
    asked = time.monotonic()
    item = review(layers)["slow.txt"]
    assert item["notShown"] == "its diff took over 0.2 seconds to make"
    assert "diff" not in item
    # Stopped, not waited for: the stand-in would have run for ten minutes.
    assert time.monotonic() - asked < 300


def test_a_page_that_takes_long_ends_early_and_the_next_goes_on(
    layers: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    layer, below, base = layers
    for number in range(3):
        write(layer, f"{number}.txt", "x\n")
    monkeypatch.setattr(diffs, "PAGE_SECONDS", 0)
    first = diff_page(layer, [below, base], "", False, MARKS)
    assert [item["path"] for item in first.files] == ["0.txt"] and first.next == "0"
    second = diff_page(layer, [below, base], first.next, False, MARKS)
    assert [item["path"] for item in second.files] == ["1.txt"] and second.next == "1"


def test_many_files_stop_at_the_cap_and_pages_put_together_are_the_whole(
    layers: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    layer, below, base = layers
    for number in range(MAX_DIFF_FILES + 5):
        write(layer, f"f{number:05}.txt", "x" * 300 + "\n")
    monkeypatch.setattr(diffs, "PAGE_CHARS", 40_000)
    pages, page = [], ""
    while True:
        answer = diff_page(layer, [below, base], page, False, MARKS)
        assert answer.truncated
        assert sum(size(item) for item in answer.files) <= 40_000
        pages.append(answer)
        if answer.next is None:
            break
        page = answer.next
    assert len(pages) > 5
    names = [item["path"] for answer in pages for item in answer.files]
    assert names == [f"f{number:05}.txt" for number in range(MAX_DIFF_FILES)]


def test_a_page_not_handed_out_is_refused(layers: tuple[Path, Path, Path]) -> None:
    layer, below, base = layers
    with pytest.raises(BoxError, match="is not one this box handed out"):
        diff_page(layer, [below, base], "-1", False, MARKS)


def test_a_layer_below_that_is_gone_is_left_out(layers: tuple[Path, Path, Path]) -> None:
    layer, below, base = layers
    write(base, "a.txt", "a\n")
    write(layer, "a.txt", "b\n")
    page = diff_page(layer, [below / "undone", base], "", False, MARKS)
    assert page.files[0]["change"] == "changed"


def test_boxctl_shows_escapes_in_names_targets_and_contents_visibly(
    layers: tuple[Path, Path, Path],
) -> None:
    layer, _, _ = layers
    write(layer, "\x1b[2Jname\u202e.txt", "\x1b]0;title\x07\rforged\n")
    (layer / "link\x1b[1m").symlink_to("\x1b[31m/etc/shadow")
    shown = "\n".join(show.diff_entry(item) for item in review(layers).values())
    assert "\x1b" not in shown and "\r" not in shown and "\u202e" not in shown
    assert "added    \\x1b[2Jname\\u202e.txt" in shown
    assert "+\\x1b]0;title\\x07\\rforged" in shown
    assert "added    link\\x1b[1m  (link to \\x1b[31m/etc/shadow)" in shown


def test_boxctl_names_binary_large_and_deleted_entries() -> None:
    assert show.diff_entry(
        {"path": "a.png", "change": "added", "kind": "file", "binary": True, "size": 3}
    ) == ("added    a.png  (binary)")
    assert show.diff_entry(
        {
            "path": "big",
            "change": "changed",
            "kind": "file",
            "tooLarge": True,
            "size": 9,
            "oldSize": 1,
        }
    ) == ("changed  big  (too large to show: 1 -> 9 bytes)")
    assert show.diff_entry({"path": "old", "change": "deleted", "kind": "dir"}) == (
        "deleted  old  (folder)"
    )


def test_only_the_owner_may_ask_for_a_review() -> None:
    method = api.find_method(api.GATEWAY, "DiffTask")
    assert method is not None and method.method is api.DIFF_TASK
    assert api.DIFF_TASK.callers == api.KEEP_TASK.callers == api.UNDO_TASK.callers
    for role in (Role.APP, Role.MEMBER, Role.BROKER, Role.PAIRING):
        assert not api.DIFF_TASK.admits(api.GATEWAY, role)
    assert api.DIFF_TASK.admits(api.MANAGER, Role.OWNER)


class _TwoPages(GatewayClient):
    """The manager's DiffTask as two pages, and its refusal for a caller not the owner."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, ...]] = []

    async def call_as(self, token: str, method: Method, *args: Any) -> Any:
        member = bound_on(GATEWAY, method).name
        self.asked.append((token, member, *args))
        if token != "owner":
            die(Problem.FORBIDDEN, OWNER_ONLY)
        head = {"id": "t123456789", "workspace": "home", "state": "done", "against": "saw"}
        if args[1] == "":
            return {**head, "truncated": False, "files": [{"path": "a"}], "next": "0"}
        return {**head, "truncated": False, "files": [{"path": "b"}]}


async def test_the_gateway_streams_every_page_and_passes_refusals_on() -> None:
    client = _TwoPages()
    async with TestClient(TestServer(make_app(client))) as http:
        answer = await http.get(
            "/api/tasks/t123456789/diff", headers={"Authorization": "Bearer owner"}
        )
        assert answer.status == 200
        assert await answer.json() == {
            "id": "t123456789",
            "workspace": "home",
            "state": "done",
            "against": "saw",
            "truncated": False,
            "files": [{"path": "a"}, {"path": "b"}],
        }
        refused = await http.get(
            "/api/tasks/t123456789/diff", headers={"Authorization": "Bearer app"}
        )
        assert (refused.status, await refused.json()) == (403, {"error": OWNER_ONLY})
    assert client.asked[:2] == [
        ("owner", "DiffTask", "t123456789", ""),
        ("owner", "DiffTask", "t123456789", "0"),
    ]


def test_an_opaque_folder_above_hides_what_is_further_down_in_it(
    layers: tuple[Path, Path, Path],
) -> None:
    """The layer below replaced folder a (opaque) and kept a/b/kept.txt; the base's
    a/b/old.txt was gone from the task's view, so deleting a/b shows only kept.txt."""
    layer, below, base = layers
    write(base, "a/b/old.txt", "old\n")
    write(below, "a/b/kept.txt", "kept\n")
    os.setxattr(below / "a", OPAQUE, b"y")
    delete(layer, "a/b")
    assert list(review(layers)) == ["a/b", "a/b/kept.txt"]
