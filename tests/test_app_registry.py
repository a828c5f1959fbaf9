"""Finding an app by its entry point (boxd/apps/registry.py): one app loaded at a time, by the
entry point named as it; an entry point whose app has another name finds nothing."""

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
    return EntryPoint(name, f"tests.test_app_registry:{attribute}")


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
    registry._points.cache_clear()
    registry._app.cache_clear()
    LOADED.clear()
    yield
    registry._points.cache_clear()
    registry._app.cache_clear()


def test_a_tool_is_found_in_its_app_loaded_alone() -> None:
    found = registry.find_tool("echo.say")
    assert found is not None and found[0] is echo_app
    assert LOADED == ["ECHO"]
    # Loaded once, however often it is looked up.
    assert registry.find_tool("echo.say") is not None
    assert LOADED == ["ECHO"]


def test_a_name_two_entry_points_declare_is_found_in_neither(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert registry.find_tool("twice.say") is None
    assert LOADED == []
    assert "app twice is declared by more than one installed package" in caplog.text
    # The other apps are found as ever.
    assert registry.find_tool("echo.say") is not None


def test_an_app_that_cannot_be_loaded_keeps_no_other_apps_tool_from_being_found() -> None:
    # Before, every app was loaded at the first look-up: one broken app broke every tool.
    with pytest.raises(ModuleNotFoundError):
        registry.find_tool("broken.say")
    assert registry.find_tool("echo.say") is not None


def test_an_app_named_otherwise_than_its_entry_point_is_not_found() -> None:
    assert registry.find_tool("wrongname.say") is None
    assert registry.find_tool("renamed.say") is None


def test_what_is_not_an_app_or_not_a_tool_is_not_found() -> None:
    assert registry.find_tool("junk.say") is None
    assert registry.find_tool("echo.nothing") is None
    assert registry.find_tool("echo") is None
    assert registry.find_tool(".say") is None
    assert registry.find_tool("nowhere.say") is None
