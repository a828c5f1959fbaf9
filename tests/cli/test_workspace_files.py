"""boxctl ls, cat and history (boxd/cli/workspace_files.py): names with control characters
shown as escapes, a file's bytes raw to a pipe and escaped to a terminal."""

import os
from pathlib import Path

import pytest

from boxd.cli.workspace_files import copy_raw, copy_shown, entry_line, history_lines, split
from boxd.errors import BoxError


def test_where_is_split_at_the_first_colon() -> None:
    assert split("docs", path_needed=False) == ("docs", "")
    assert split("docs:a/b:c.md", path_needed=True) == ("docs", "a/b:c.md")
    with pytest.raises(BoxError, match="WORKSPACE:PATH"):
        split("docs", path_needed=True)


def test_a_name_with_control_characters_is_shown_escaped() -> None:
    line = entry_line(
        {
            "name": "evil\x1b]0;owned\x07\u202e.md",
            "kind": "link",
            "size": 11,
            "modified": "2026-01-01T00:00:00Z",
            "task": "t1",
            "target": "/etc/shadow\x1b[2J",
        }
    )
    assert "\x1b" not in line and "\u202e" not in line and "\x07" not in line
    assert "evil\\x1b]0;owned\\x07\\u202e.md -> /etc/shadow\\x1b[2J" in line
    assert history_lines({"path": "a", "tasks": [], "inBase": False}) == ["no task touched a"]


def test_cat_to_a_pipe_is_raw_and_to_a_terminal_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = b"title\x1b]0;owned\x07\nnot utf-8: \xff\n"
    (tmp_path / "f").write_bytes(raw)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    read, write = os.pipe()
    try:
        copy_raw(fd, write)
        os.close(write)
        assert os.read(read, 1000) == raw
        os.lseek(fd, 0, os.SEEK_SET)
        copy_shown(fd)
        assert capsys.readouterr().out == "title\\x1b]0;owned\\x07\nnot utf-8: \\xff\n"
    finally:
        os.close(fd)
        os.close(read)
