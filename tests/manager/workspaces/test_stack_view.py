"""The workspace as it stands (boxd/manager/workspaces/stack_view.py), on temp folders standing for
a workspace's base and done layers. Overlayfs's own marks need root: here, as in test_diffs.py, a
whiteout is an empty sticky file and an opaque folder one with a user.* xattr (the Marks seam).
The attacker's cases come first."""

import os
import stat
import threading
from pathlib import Path

import pytest

from boxd.cli.show import visible
from boxd.errors import BoxError, Problem
from boxd.manager.workspaces import stack_view
from boxd.manager.workspaces.stack_view import (
    MAX_LISTED,
    Entry,
    Level,
    Stack,
    history,
    list_folder,
    open_file,
)
from boxd.wire.models.task_diff import Kind
from tests.support.layer_marks import MARKS, OPAQUE, delete, write


@pytest.fixture
def levels(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Two done layers ("2" newest, "1") and the base."""
    made = tmp_path / "2", tmp_path / "1", tmp_path / "base"
    for path in made:
        path.mkdir()
    return made


def stack(levels: tuple[Path, Path, Path]) -> Stack:
    newer, older, base = levels
    return Stack([Level("2", newer), Level("1", older), Level(None, base)], MARKS)


def listed(levels: tuple[Path, Path, Path], path: str = "") -> dict[str, Entry]:
    listing = list_folder(stack(levels), path)
    assert not listing.truncated
    return {entry.name: entry for entry in listing.entries}


def read(levels: tuple[Path, Path, Path], path: str) -> bytes:
    fd, _ = open_file(stack(levels), path)
    try:
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def refused(levels: tuple[Path, Path, Path], path: str, problem: Problem = Problem.INVALID) -> str:
    with pytest.raises(BoxError) as caught:
        open_file(stack(levels), path)
    assert caught.value.problem == problem
    return str(caught.value)


# The attacker's cases.


@pytest.mark.parametrize("target", ["/etc/shadow", "../../workspaces/other/secret.txt"])
def test_a_link_out_is_listed_as_a_link_and_never_followed(
    levels: tuple[Path, Path, Path], target: str
) -> None:
    newer, _, _ = levels
    (newer / "shadow").symlink_to(target)
    entry = listed(levels)["shadow"]
    assert entry.kind == Kind.LINK and entry.layer == "2"
    assert entry.size == len(target)  # the link's own size, not its target's
    assert "a link, not a plain file" in refused(levels, "shadow")


def test_a_folder_link_on_the_way_is_not_followed(
    levels: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    newer, _, _ = levels
    outside = tmp_path / "outside"
    write(outside, "secret.txt", "secret")
    (newer / "door").symlink_to(outside)
    refused(levels, "door/secret.txt", Problem.NOT_FOUND)
    with pytest.raises(BoxError) as caught:
        list_folder(stack(levels), "door")
    assert "is a link, not a folder" in str(caught.value)


def test_a_fifo_is_refused_without_hanging(levels: tuple[Path, Path, Path]) -> None:
    newer, _, _ = levels
    os.mkfifo(newer / "pipe")
    assert listed(levels)["pipe"].kind == Kind.OTHER
    done: list[str] = []
    reader = threading.Thread(target=lambda: done.append(refused(levels, "pipe")), daemon=True)
    reader.start()
    reader.join(5)
    assert done and "a FIFO, not a plain file" in done[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="a device node needs root")
def test_a_device_is_refused_unopened(levels: tuple[Path, Path, Path]) -> None:
    newer, _, _ = levels
    os.mknod(newer / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    assert listed(levels)["null"].kind == Kind.OTHER
    assert "a device, not a plain file" in refused(levels, "null")


@pytest.mark.parametrize("swap", ["link", "fifo"])
def test_a_file_swapped_between_listing_and_reading_is_refused(
    levels: tuple[Path, Path, Path], swap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    newer, _, _ = levels
    write(newer, "report.md", "the report")
    assert listed(levels)["report.md"].kind == Kind.FILE
    looked_up = stack_view._topmost

    def then_swapped(*args: object, **kwargs: object) -> object:
        found = looked_up(*args, **kwargs)  # type: ignore[arg-type]
        (newer / "report.md").unlink()
        if swap == "link":
            (newer / "report.md").symlink_to("/etc/shadow")
        else:
            os.mkfifo(newer / "report.md")
        return found

    monkeypatch.setattr(stack_view, "_topmost", then_swapped)
    words = refused(levels, "report.md")
    assert f"is a {swap.replace('fifo', 'FIFO')}, not a plain file" in words


def test_a_folder_swapped_for_a_link_between_lookup_and_open_is_refused(
    levels: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    newer, _, _ = levels
    write(newer, "docs/report.md", "the report")
    write(tmp_path / "outside", "report.md", "secret")
    looked_up = stack_view._topmost

    def then_swapped(*args: object, **kwargs: object) -> object:
        found = looked_up(*args, **kwargs)  # type: ignore[arg-type]
        (newer / "docs").rename(tmp_path / "moved")
        (newer / "docs").symlink_to(tmp_path / "outside")
        return found

    monkeypatch.setattr(stack_view, "_topmost", then_swapped)
    words = refused(levels, "docs/report.md", Problem.FAILED)
    assert "a folder on its way changed" in words


@pytest.mark.parametrize("name", ["esc\x1b[31mred", "cr\rhidden", "evil\u202etxt.exe", "nl\nx"])
def test_names_that_would_lie_are_shown_escaped(levels: tuple[Path, Path, Path], name: str) -> None:
    newer, _, _ = levels
    write(newer, name, "x")
    (entry,) = list_folder(stack(levels), "").entries
    assert entry.name == name  # as the diff review names it; every reader shows it escaped
    shown = visible(entry.name)
    assert not any(char in shown for char in "\x1b\r\n\u202e")
    assert read(levels, name) == b"x"


def test_a_name_not_utf8_is_shown_as_bytes(levels: tuple[Path, Path, Path]) -> None:
    newer, _, _ = levels
    (newer / os.fsdecode(b"caf\xe9")).write_text("x")
    (entry,) = list_folder(stack(levels), "").entries
    assert entry.name == "caf\\xe9" and entry.not_utf8


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("../base/secret", "not a path in the workspace"),
        ("a/../../b", "not a path in the workspace"),
        ("a//b", "not a path in the workspace"),
        ("a/./b", "not a path in the workspace"),
        ("a/", "not a path in the workspace"),
        ("a\0b", "not a path in the workspace"),
        ("/etc/shadow", "relative, with no leading /"),
        ("a/" * 2048 + "b", "at most 4096 bytes"),
        ("x" * 256, "at most 255 bytes"),
    ],
)
def test_a_path_that_leads_out_or_is_too_long_is_refused_in_words(
    levels: tuple[Path, Path, Path], path: str, words: str
) -> None:
    for call in (list_folder, open_file, history):
        with pytest.raises(BoxError) as caught:
            call(stack(levels), path)
        assert caught.value.problem == Problem.INVALID
        assert words in str(caught.value)


def test_a_whiteout_hides_the_base_file(levels: tuple[Path, Path, Path]) -> None:
    newer, _, base = levels
    write(base, "notes.md", "notes")
    write(base, "kept.md", "kept")
    delete(newer, "notes.md")
    assert set(listed(levels)) == {"kept.md"}
    refused(levels, "notes.md", Problem.NOT_FOUND)
    assert history(stack(levels), "notes.md") == ["2", None]


def test_an_opaque_folder_hides_the_base_folder(levels: tuple[Path, Path, Path]) -> None:
    _, older, base = levels
    write(base, "docs/old.md", "old")
    write(base, "docs/deep/older.md", "older")
    write(older, "docs/new.md", "new")
    os.setxattr(older / "docs", OPAQUE, b"y")
    assert set(listed(levels, "docs")) == {"new.md"}
    refused(levels, "docs/old.md", Problem.NOT_FOUND)
    with pytest.raises(BoxError):
        list_folder(stack(levels), "docs/deep")
    assert history(stack(levels), "docs/old.md") == ["1", None]
    assert history(stack(levels), "docs/deep/older.md") == ["1", None]


def test_the_newer_layer_wins_and_history_lists_both(levels: tuple[Path, Path, Path]) -> None:
    newer, older, base = levels
    write(base, "report.md", "base")
    write(older, "report.md", "first")
    write(newer, "report.md", "second, longer")
    write(older, "only-older.md", "o")
    entries = listed(levels)
    assert entries["report.md"].layer == "2" and entries["report.md"].size == 14
    assert entries["only-older.md"].layer == "1"
    assert read(levels, "report.md") == b"second, longer"
    assert history(stack(levels), "report.md") == ["2", "1", None]
    assert history(stack(levels), "only-older.md") == ["1"]


def test_a_folder_merges_its_layers_and_names_the_topmost(
    levels: tuple[Path, Path, Path],
) -> None:
    newer, older, base = levels
    write(base, "src/a.py", "a")
    write(older, "src/b.py", "b")
    write(newer, "src/c.py", "c")
    assert {name: entry.layer for name, entry in listed(levels, "src").items()} == {
        "a.py": None,
        "b.py": "1",
        "c.py": "2",
    }
    assert listed(levels)["src"].kind == Kind.DIR and listed(levels)["src"].layer == "2"


def test_a_file_over_a_folder_hides_what_was_in_it(levels: tuple[Path, Path, Path]) -> None:
    newer, _, base = levels
    write(base, "src/a.py", "a")
    write(newer, "src", "now a file")
    with pytest.raises(BoxError) as caught:
        list_folder(stack(levels), "src")
    assert "is a file, not a folder" in str(caught.value)
    refused(levels, "src/a.py", Problem.NOT_FOUND)
    assert read(levels, "src") == b"now a file"


def test_a_terabyte_sparse_file_is_listed_with_its_size_and_never_read(
    levels: tuple[Path, Path, Path],
) -> None:
    newer, _, _ = levels
    with (newer / "huge").open("wb") as huge:
        huge.truncate(1 << 40)
    assert listed(levels)["huge"].size == 1 << 40
    fd, entry = open_file(stack(levels), "huge")
    try:
        assert entry.size == 1 << 40 and entry.kind == Kind.FILE and entry.layer == "2"
        assert os.read(fd, 4) == b"\0\0\0\0"  # the caller reads what it asks for, no more
    finally:
        os.close(fd)


def test_a_folder_past_the_cap_is_cut_and_says_so(
    levels: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, older, base = levels
    for number in range(30):
        (base / f"base-{number}").touch()
        (older / f"older-{number}").touch()
    monkeypatch.setattr(stack_view, "MAX_LISTED", 40)
    listing = list_folder(stack(levels), "")
    assert listing.truncated and len(listing.entries) == 40
    assert MAX_LISTED >= 10_000  # bench/workspace_view.py lists 10,000 files whole


def test_a_million_whiteouts_end_the_listing_at_the_scan_cap(
    levels: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    newer, _, base = levels
    for number in range(50):
        delete(newer, f"gone-{number}")
    (base / "kept").touch()
    monkeypatch.setattr(stack_view, "MAX_SCANNED", 20)
    listing = list_folder(stack(levels), "")
    assert listing.truncated and listing.entries == []


# The ordinary cases.


def test_the_root_and_a_missing_folder(levels: tuple[Path, Path, Path]) -> None:
    assert list_folder(stack(levels), "").entries == []
    with pytest.raises(BoxError) as caught:
        list_folder(stack(levels), "nowhere")
    assert caught.value.problem == Problem.NOT_FOUND
    assert "there is no folder 'nowhere'" in str(caught.value)
    refused(levels, "", Problem.INVALID)
    assert history(stack(levels), "nowhere") == []


def test_a_layer_gone_since_is_left_out(levels: tuple[Path, Path, Path]) -> None:
    newer, _, base = levels
    write(base, "a.md", "a")
    newer.rmdir()
    assert listed(levels)["a.md"].layer is None


def test_a_folder_in_the_base_only_is_listed(levels: tuple[Path, Path, Path]) -> None:
    _, _, base = levels
    write(base, "docs/readme.md", "hello")
    entry = listed(levels, "docs")["readme.md"]
    assert (entry.kind, entry.size, entry.layer) == (Kind.FILE, 5, None)
    assert entry.mtime == (base / "docs/readme.md").stat().st_mtime
    assert read(levels, "docs/readme.md") == b"hello"


def test_changes_say_what_each_level_did_newest_first(levels: tuple[Path, Path, Path]) -> None:
    newer, older, base = levels
    write(base, "a.md", "base")
    write(older, "a.md", "older")
    delete(newer, "a.md")
    write(newer, "b.md", "new")
    (older / "link").symlink_to("/etc/shadow")
    assert stack_view.changes(stack(levels), "a.md") == [
        ("2", "deleted"),
        ("1", "changed"),
        (None, "added"),
    ]
    assert stack_view.changes(stack(levels), "b.md") == [("2", "added")]
    assert stack_view.link_target(stack(levels), "1", "link") == "/etc/shadow"
    assert stack_view.link_target(stack(levels), "2", "link") is None
