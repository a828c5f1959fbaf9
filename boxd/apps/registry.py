"""Finds the installed apps by their entry points (group `boxd.apps`), each named as its app.

They are loaded on the first look-up of one of their tools (a task's first GET /tools or POST
/call), not when a broker starts, and one app at a time: most tasks' brokers start, log steps
and exit idle without a tool, and a broker holds for good what it imported (an app, its
modules, the App SDK and pydantic), so a task that calls only `echo.say` loads `echo` alone. An
app that cannot be loaded fails its own tools' look-ups, no other app's.
"""

import logging
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from boxd.apps.entry_points import EntryPoint
    from boxd.sdk import App, Tool

GROUP = "boxd.apps"
log = logging.getLogger(__name__)


@cache
def _points() -> "dict[str, EntryPoint]":
    """By name, the entry point of each app that one installed distribution alone names (of a
    distribution installed twice, only the first on the path counts). A name two of them
    declare is neither's: which one won would otherwise hang on the order of files in a
    directory, and a package could take another app's name, and its secrets."""
    # Here, not at import: reading the installed packages' metadata is part of a broker's start
    # that most tasks never need.
    from boxd.apps.entry_points import entry_points

    claimed: dict[str, list[EntryPoint]] = {}
    for point in entry_points(group=GROUP):
        claimed.setdefault(point.name, []).append(point)
    for name, points in claimed.items():
        if len(points) > 1:
            log.warning(
                "app %s is declared by more than one installed package (%s): neither is loaded; "
                "uninstall all but one",
                name,
                ", ".join(point.value for point in points),
            )
    return {name: points[0] for name, points in claimed.items() if len(points) == 1}


@cache
def _app(name: str) -> "App | None":
    """The app named `name`: its entry point's, if that names an App of the same name."""
    # Here, not at import: the App SDK comes with the apps, which import it.
    from boxd.sdk import App

    point = _points().get(name)
    app = point.load() if point is not None else None
    return app if isinstance(app, App) and app.name == name else None


def find_tool(name: str) -> "tuple[App, Tool[Any]] | None":
    app_name, _, verb = name.partition(".")
    app = _app(app_name) if app_name else None
    tool = app.tool(verb) if app is not None and verb else None
    return None if app is None or tool is None else (app, tool)
