"""The space a task's changes take, counted without following what the task could swap in."""

import os
from pathlib import Path

from boxd.manager.record.disk import full_words, tree_bytes


def test_counts_files_in_nested_folders(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "big").write_bytes(os.urandom(1 << 20))
    (tmp_path / "small").write_bytes(b"x")
    assert (1 << 20) <= tree_bytes(tmp_path) < (1 << 20) + 64 * 1024


def test_never_follows_a_link_out_of_the_tree(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "huge").write_bytes(os.urandom(1 << 20))
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "to-a-folder").symlink_to(outside)
    (tree / "to-a-file").symlink_to(outside / "huge")
    assert tree_bytes(tree) < 64 * 1024


def test_a_missing_tree_takes_nothing(tmp_path: Path) -> None:
    assert tree_bytes(tmp_path / "gone") == 0


def test_the_box_says_it_first_and_keeps_what_the_worker_said() -> None:
    words = full_words("The worker exited with status 1: 116 MB copied")
    assert words.startswith("The box's disk is full: the task could not write what it needed.")
    assert words.endswith("(The worker exited with status 1: 116 MB copied)")
