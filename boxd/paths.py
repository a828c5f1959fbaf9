"""Where the box keeps its state. BOX_HOME moves it all, for tests that run without root."""

import os
from pathlib import Path

DEFAULT_BOX_HOME = Path("/var/lib/box")


def box_home() -> Path:
    return Path(os.environ.get("BOX_HOME", str(DEFAULT_BOX_HOME)))


def database_path(home: Path) -> Path:
    return home / "box.db"


def workspaces_dir(home: Path) -> Path:
    return home / "workspaces"


def tasks_dir(home: Path) -> Path:
    return home / "tasks"


def task_dir(home: Path, task_id: str) -> Path:
    return tasks_dir(home) / task_id


def task_work_dir(home: Path, task_id: str) -> Path:
    return task_dir(home, task_id) / "work"


def task_own_home(home: Path, task_id: str) -> Path:
    """The worker's HOME and caches: its own, outside the workspace view that tasks share."""
    return task_dir(home, task_id) / "home"


def task_manifest(home: Path, task_id: str) -> Path:
    """What a personal task saw when it started, to find conflicts when it is kept."""
    return task_dir(home, task_id) / "manifest.json"


def broker_socket(home: Path, task_id: str) -> Path:
    return task_dir(home, task_id) / "broker.sock"
