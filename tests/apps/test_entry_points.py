"""Reading a group's entry points without importlib.metadata (boxd/apps/entry_points.py): it
finds what importlib.metadata finds for distributions installed as pip installs them."""

import importlib.metadata
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from boxd.apps.entry_points import EntryPoint, entry_points

GROUP = "boxd.apps"


def _distribution(site: Path, directory: str, entry_points_txt: str | bytes) -> None:
    info = site / directory
    info.mkdir(parents=True)
    name = directory.partition("-")[0]
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    text = entry_points_txt
    if isinstance(text, bytes):
        (info / "entry_points.txt").write_bytes(text)
    else:
        (info / "entry_points.txt").write_text(text)


@pytest.fixture
def sites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """Two directories first on sys.path, as a user's site and a venv's would be."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    # New directories: importlib.metadata's caches, by directory, know neither.
    monkeypatch.setattr(sys, "path", [str(first), str(second), *sys.path])
    yield first, second


def _as_importlib_finds(group: str) -> list[EntryPoint]:
    return [EntryPoint(p.name, p.value) for p in importlib.metadata.entry_points(group=group)]


def test_what_is_installed_here_is_found_as_importlib_metadata_finds_it() -> None:
    # boxd's own apps, and a group with many points from many distributions.
    for group in (GROUP, "console_scripts"):
        assert sorted(entry_points(group)) == sorted(_as_importlib_finds(group)), group
    assert EntryPoint("echo", "boxd.apps.echo:app") in entry_points(GROUP)


def test_the_first_distribution_of_a_name_on_the_path_is_the_only_one_read(
    sites: tuple[Path, Path],
) -> None:
    first, second = sites
    _distribution(first, "Some.App-2.0.dist-info", "[boxd.apps]\nsome = some_app:app\n")
    # The same distribution, its name written otherwise, older, further on the path.
    _distribution(
        second, "some_app-1.0.dist-info", "[boxd.apps]\nsome = old:app\nother = old:other\n"
    )
    _distribution(second, "legacy-0.1.egg-info", "[boxd.apps]\nlegacy = legacy.mod:thing.app\n")
    found = entry_points(GROUP)
    assert found[:2] == [
        EntryPoint("some", "some_app:app"),
        EntryPoint("legacy", "legacy.mod:thing.app"),
    ]
    assert found == _as_importlib_finds(GROUP)


def test_only_the_group_s_lines_are_read_and_what_is_not_a_point_is_passed_over(
    sites: tuple[Path, Path],
) -> None:
    first, _ = sites
    _distribution(
        first,
        "mixed-1.0.dist-info",
        "# a comment\n\n[console_scripts]\nmixed = mixed:main\n"
        "[ boxd.apps ]\nspaced = mixed:spaced\n"
        "[boxd.apps]\n  a = mixed : app  \nnot a point\n# b = mixed:b\nc=mixed:c\n",
    )
    _distribution(
        first, "latin-1.0.dist-info", "[boxd.apps]\nl\xe9 = latin:app\n".encode("latin-1")
    )
    _distribution(first, "zz-1.0.dist-info", "[boxd.apps]\nzz = zz:app\n")
    assert entry_points(GROUP)[:3] == [
        EntryPoint("a", "mixed : app"),
        EntryPoint("c", "mixed:c"),
        EntryPoint("zz", "zz:app"),
    ]


def test_a_path_that_is_not_a_directory_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "apps.zip").write_bytes(b"PK\x05\x06" + bytes(18))
    monkeypatch.setattr(sys, "path", [str(tmp_path / "apps.zip"), str(tmp_path / "gone")])
    assert entry_points(GROUP) == []


def test_a_point_loads_its_module_then_its_attributes(sites: tuple[Path, Path]) -> None:
    first, _ = sites
    (first / "pkg_of_points").mkdir()
    (first / "pkg_of_points" / "__init__.py").write_text("")
    (first / "pkg_of_points" / "inner.py").write_text("class Holder:\n    app = 'the app'\n")
    assert EntryPoint("x", "pkg_of_points.inner:Holder.app").load() == "the app"
    assert EntryPoint("x", "pkg_of_points.inner : Holder.app [extra]").load() == "the app"
    module = EntryPoint("x", "pkg_of_points.inner").load()
    assert getattr(module, "__name__", None) == "pkg_of_points.inner"
    with pytest.raises(ImportError, match="names no module"):
        EntryPoint("x", "not a module!").load()
    with pytest.raises(AttributeError):
        EntryPoint("x", "pkg_of_points.inner:Nothing").load()
    with pytest.raises(ModuleNotFoundError):
        EntryPoint("x", "pkg_of_points.none:app").load()
