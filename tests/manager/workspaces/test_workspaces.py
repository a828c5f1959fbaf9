from pathlib import Path

import pytest

from boxd.errors import BoxError, Problem
from boxd.manager.workspaces.workspaces import Workspaces


async def test_create_list_and_remove_to_the_trash(tmp_path: Path) -> None:
    spaces = Workspaces(tmp_path)
    spaces.open()
    assert spaces.names() == ["home"]
    assert await spaces.create("notes") == {
        "name": "notes",
        "path": str(tmp_path / "workspaces" / "notes"),
    }
    (tmp_path / "workspaces" / "notes" / "keep.txt").write_text("mine")
    assert spaces.names() == ["home", "notes"]
    spaces.check_removable("notes", busy=[])
    removed = await spaces.move_to_trash("notes", tmp_path / "layers" / "notes")
    assert not spaces.exists("notes")
    assert (Path(removed["trash"]) / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("name", "busy", "problem", "words"),
    [
        ("home", [], Problem.INVALID, "home is the box's default workspace"),
        ("nowhere", [], Problem.NOT_FOUND, "no workspace nowhere"),
        ("../etc", [], Problem.INVALID, "is not a workspace name"),
        ("notes", ["t000000001"], Problem.INVALID, "has unfinished tasks (t000000001)"),
    ],
)
async def test_refusals(
    tmp_path: Path, name: str, busy: list[str], problem: Problem, words: str
) -> None:
    spaces = Workspaces(tmp_path)
    spaces.open()
    await spaces.create("notes")
    with pytest.raises(BoxError) as caught:
        spaces.check_removable(name, busy)
    assert caught.value.problem == problem and words in caught.value.message


async def test_create_refuses_bad_names_and_twins(tmp_path: Path) -> None:
    spaces = Workspaces(tmp_path)
    spaces.open()
    for name, words in (
        (".hidden", "is not a workspace name"),
        ("a/b", "is not a workspace name"),
        ("home", "workspace home already exists"),
    ):
        with pytest.raises(BoxError) as caught:
            await spaces.create(name)
        assert words in caught.value.message


async def test_bases_and_shared_files_are_closed_to_other_users(tmp_path: Path) -> None:
    spaces = Workspaces(tmp_path)
    spaces.open()
    await spaces.create("files-t000000001", files=True)
    await spaces.put("files-t000000001", {"a.txt": b"secret"})
    root = tmp_path / "workspaces"
    assert root.stat().st_mode & 0o7777 == 0o750
    for base in ("home", "files-t000000001"):
        assert (root / base).stat().st_mode & 0o7777 == 0o2770, base
    assert (root / "files-t000000001" / "a.txt").stat().st_mode & 0o777 == 0o660
