"""Finds the installed apps by their entry points (group `boxd.apps`).

They are loaded on the first look-up of a tool (a task's first GET /tools or POST /call), not
when a broker starts: most tasks' brokers start, log steps and exit idle without a tool.
"""

from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from boxd.sdk import App, Tool


@cache
def installed_apps() -> "dict[str, App]":
    # Here, not at import: reading the installed packages' metadata is some 14 ms of a broker's
    # start. The App SDK comes with the apps, which import it.
    from importlib.metadata import entry_points

    from boxd.sdk import App

    apps: dict[str, App] = {}
    for point in entry_points(group="boxd.apps"):
        app = point.load()
        if isinstance(app, App):
            apps[app.name] = app
    return apps


def find_tool(name: str) -> "tuple[App, Tool[Any]] | None":
    app_name, _, verb = name.partition(".")
    app = installed_apps().get(app_name)
    tool = app.tool(verb) if app is not None and verb else None
    return None if app is None or tool is None else (app, tool)


def tool_names() -> list[str]:
    return sorted(
        f"{app.name}.{tool.verb}" for app in installed_apps().values() for tool in app.tools
    )
