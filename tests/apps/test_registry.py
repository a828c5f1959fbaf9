"""Finding the apps by their entry points (boxd/apps/registry.py): which are installed, read
without importing any (the manager, as root, does this), and one app loaded by its own runner,
by the entry point named as it; an entry point whose app has another name loads nothing."""

from collections.abc import Iterator

import pytest

from boxd.apps import entry_points, registry
from boxd.apps.echo import app as echo_app
from boxd.apps.entry_points import EntryPoint
from boxd.sdk import App

# What the entry points below name.
RENAMED = App(name="renamed", tools=echo_app.tools)
NOT_AN_APP = "not an app"
LOADED: list[str] = []


def _point(name: str, attribute: str) -> EntryPoint:
    return EntryPoint(name, f"tests.apps.test_registry:{attribute}")


POINTS = [
    _point("echo", "ECHO"),
    # A name two installed packages declare: a package must not take another app's name.
    _point("twice", "ECHO"),
    _point("twice", "RENAMED"),
    _point("wrongname", "RENAMED"),
    _point("junk", "NOT_AN_APP"),
    EntryPoint("broken", "tests.no_such_module:app"),
]


def __getattr__(name: str) -> object:
    # Records which entry points were loaded, as the apps' modules would be imported.
    if name == "ECHO":
        LOADED.append(name)
        return echo_app
    raise AttributeError(name)


@pytest.fixture(autouse=True)
def points(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(
        entry_points, "entry_points", lambda group: POINTS if group == registry.GROUP else []
    )
    LOADED.clear()
    yield


def test_the_installed_apps_are_found_without_their_code() -> None:
    found = registry.installed()
    assert sorted(found) == ["broken", "echo", "junk", "wrongname"]
    # Only the manager reads this, as root: no app's code was imported.
    assert LOADED == []


def test_an_app_is_loaded_alone_by_its_name() -> None:
    assert registry.load("echo") is echo_app
    assert LOADED == ["ECHO"]


def test_a_name_two_entry_points_declare_is_neithers(caplog: pytest.LogCaptureFixture) -> None:
    assert "twice" not in registry.installed()
    assert "app twice is declared by more than one installed package" in caplog.text
    with pytest.raises(registry.NotLoaded, match="no installed package declares app twice"):
        registry.load("twice")
    assert LOADED == []


def test_a_name_no_runner_could_run_under_is_not_an_app(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    odd = [_point(name, "ECHO") for name in ("Shouty", "box", "a.b", "x" * 24, "ok-app")]
    monkeypatch.setattr(entry_points, "entry_points", lambda group: odd)
    assert list(registry.installed()) == ["ok-app"]
    assert (
        "app 'Shouty' (tests.apps.test_registry:ECHO) is not run: an app's name is" in caplog.text
    )


def test_what_cannot_be_loaded_says_why() -> None:
    with pytest.raises(ModuleNotFoundError):
        registry.load("broken")
    with pytest.raises(registry.NotLoaded, match="names app 'renamed'; an app's entry point"):
        registry.load("wrongname")
    with pytest.raises(registry.NotLoaded, match=r"names no boxd.sdk.App"):
        registry.load("junk")
    with pytest.raises(registry.NotLoaded):
        registry.load("nowhere")
