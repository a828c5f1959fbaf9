"""A reader of a worker's last words opens the system's journal files and its user's, not one
file for every task that ever ran (journald keeps one per uid)."""

from pathlib import Path

from boxd.manager.units.last_words import journal_files


def test_only_the_system_and_the_users_files_are_read(tmp_path: Path) -> None:
    persistent, volatile = tmp_path / "var", tmp_path / "run"
    (persistent / "m1").mkdir(parents=True)
    (volatile / "m1").mkdir(parents=True)
    (persistent / "m2").mkdir()
    names = [
        "system.journal",
        "system@0001-0002.journal",
        "system@0003-0004.journal~",
        "user-4242.journal",
        "user-4242@0005-0006.journal",
        "user-42420.journal",
        "user-424.journal",
        "user-4242.journal.tmp",
        "user-4242",
    ]
    names += [f"user-{1879048192 + n}.journal" for n in range(2000)]
    for name in names:
        (persistent / "m1" / name).touch()
    (volatile / "m1" / "system.journal").touch()
    (persistent / "m2" / "system.journal").touch()
    found = journal_files("m1", 4242, (persistent, volatile))
    assert sorted(Path(f).relative_to(tmp_path).as_posix() for f in found) == [
        "run/m1/system.journal",
        "var/m1/system.journal",
        "var/m1/system@0001-0002.journal",
        "var/m1/system@0003-0004.journal~",
        "var/m1/user-4242.journal",
        "var/m1/user-4242@0005-0006.journal",
    ]
    assert len(journal_files("m1", None, (persistent, volatile))) == 4
    assert journal_files("gone", 4242, (persistent, volatile)) == []
