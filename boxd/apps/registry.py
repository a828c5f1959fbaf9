"""Finds the installed apps by their entry points (group `boxd.apps`), each named as its app.

Which apps there are is read from the installed packages' metadata without importing any of
them (boxd/apps/entry_points.py): the manager, as root, learns them so, and never runs an app's
code. An app's code is imported by its own runner alone (`boxd app <name>`,
box-app@<name>.service), as the app's own user.
"""

import logging
from typing import TYPE_CHECKING

from boxd.wire.secret_names import APP_NAME_WORDS, BOX, is_app_name

if TYPE_CHECKING:
    from boxd.apps.entry_points import EntryPoint
    from boxd.sdk import App

GROUP = "boxd.apps"
log = logging.getLogger(__name__)


class NotLoaded(Exception):
    """The app's entry point names nothing the runner can run: the words say why."""


def installed() -> "dict[str, EntryPoint]":
    """By name, the entry point of each app that one installed distribution alone names (of a
    distribution installed twice, only the first on the path counts). A name two of them
    declare is neither's: which one won would otherwise hang on the order of files in a
    directory, and a package could take another app's name, its state and its secrets."""
    # Here, not at import: reading the installed packages' metadata is work most callers of
    # this module's neighbours never need.
    from boxd.apps.entry_points import entry_points

    claimed: dict[str, list[EntryPoint]] = {}
    for point in entry_points(group=GROUP):
        claimed.setdefault(point.name, []).append(point)
    found: dict[str, EntryPoint] = {}
    for name, points in claimed.items():
        if len(points) > 1:
            log.warning(
                "app %s is declared by more than one installed package (%s): neither is run; "
                "uninstall all but one",
                name,
                ", ".join(point.value for point in points),
            )
        elif not is_app_name(name):
            log.warning(
                "app %r (%s) is not run: an app's name is %s, and not %r",
                name,
                points[0].value,
                APP_NAME_WORDS,
                BOX,
            )
        else:
            found[name] = points[0]
    return found


def load(name: str) -> "App":
    """The app named `name`, its code imported: only in its own runner."""
    # Here, not at import: the App SDK comes with the apps, which import it.
    from boxd.sdk import App

    point = installed().get(name)
    if point is None:
        raise NotLoaded(f"no installed package declares app {name} (entry point group {GROUP})")
    app = point.load()
    if not isinstance(app, App):
        raise NotLoaded(f"the entry point of app {name} ({point.value}) names no boxd.sdk.App")
    if app.name != name:
        raise NotLoaded(
            f"the entry point of app {name} ({point.value}) names app {app.name!r}; an app's "
            "entry point is named as the app"
        )
    return app
