"""The worker's own home: made closed, and removed without following what the task left in it."""

import os
from pathlib import Path

from boxd.manager.units import task_home
from boxd.paths import task_dir, task_own_home


async def test_made_for_the_task_alone_and_made_again_as_it_was(tmp_path: Path) -> None:
    task_dir(tmp_path, "t000000001").mkdir(parents=True)
    made = await task_home.prepare(tmp_path, "t000000001", os.getuid())
    assert made == task_own_home(tmp_path, "t000000001")
    assert made.stat().st_mode & 0o7777 == 0o700
    (made / ".cache").mkdir()
    # After a restart, the same home with what the task already had in it.
    assert await task_home.prepare(tmp_path, "t000000001", os.getuid()) == made
    assert (made / ".cache").is_dir()


async def test_removed_without_following_a_link_the_task_left(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("not the task's")
    task_dir(tmp_path, "t000000001").mkdir(parents=True)
    made = await task_home.prepare(tmp_path, "t000000001", os.getuid())
    (made / "link").symlink_to(outside)
    (made / "deep").mkdir()
    (made / "deep" / "link").symlink_to(outside, target_is_directory=True)
    await task_home.remove(tmp_path, "t000000001")
    assert not made.exists()
    assert (outside / "precious.txt").read_text() == "not the task's"
    # A task whose home is already gone (or never was) ends all the same.
    await task_home.remove(tmp_path, "t000000002")
