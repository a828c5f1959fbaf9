"""Finds the installed apps by their entry points (group `boxd.apps`)."""

from functools import cache
from importlib.metadata import entry_points
from typing import Any

from boxd.sdk import App, Tool


@cache
def installed_apps() -> dict[str, App]:
    apps: dict[str, App] = {}
    for point in entry_points(group="boxd.apps"):
        app = point.load()
        if isinstance(app, App):
            apps[app.name] = app
    return apps


def find_tool(name: str) -> tuple[App, Tool[Any]] | None:
    app_name, _, verb = name.partition(".")
    app = installed_apps().get(app_name)
    tool = app.tool(verb) if app is not None and verb else None
    return None if app is None or tool is None else (app, tool)


def tool_names() -> list[str]:
    return sorted(
        f"{app.name}.{tool.verb}" for app in installed_apps().values() for tool in app.tools
    )
