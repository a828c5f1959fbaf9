"""The transient service a task's worker runs in, `box-task-<id>.service`.

A service, not a scope: systemd refuses sandboxing properties on scopes. RemainAfterExit keeps
the unit, with its exit status, loaded until the manager has recorded the result, even if the
manager was down when the worker exited (systemd 252 has no AddRef for transient units).
"""

import signal
import sys
from pathlib import Path

from dbus_fast import Variant

from boxd.manager.units.netns import HTTP_PROXY_PORT, MODEL_GATEWAY_PORT, SOCKS_PROXY_PORT
from boxd.manager.units.sandbox import sandbox_properties
from boxd.net.proxy_environment import proxy_environment
from boxd.paths import broker_socket, task_own_home, task_work_dir
from boxd.wire.ids import task_user
from boxd.wire.models.settings import Settings
from boxd.wire.models.task import Task
from boxd.wire.models.task_request import Worker
from boxd.wire.worker_kinds import WORKERS

WORK_GROUP = "boxd-work"


def worker_unit(task_id: str) -> str:
    return f"box-task-{task_id}.service"


def broker_socket_unit(task_id: str) -> str:
    return f"box-broker@{task_id}.socket"


def egress_socket_units(task_id: str) -> list[str]:
    """The task's proxy sockets, bound inside its network namespace, served by its broker."""
    return [f"box-egress-http@{task_id}.socket", f"box-egress-socks@{task_id}.socket"]


def model_socket_unit(task_id: str) -> str:
    """The task's model gateway socket, bound inside its network namespace, served by its
    broker."""
    return f"box-model@{task_id}.socket"


# What the worker uses as its model's base URL (Droid's custom model `baseUrl`): the gateway,
# which adds the key; the worker never has one.
MODEL_URL = f"http://127.0.0.1:{MODEL_GATEWAY_PORT}"


def broker_service_unit(task_id: str) -> str:
    return f"box-broker@{task_id}.service"


# systemd nests slices by the dashes in their names: every box-<id>.slice is inside box.slice,
# which holds the limits for all tasks together.
ALL_TASKS_SLICE = "box.slice"


def task_slice(task_id: str) -> str:
    return f"box-{task_id}.slice"


def all_tasks_properties(settings: Settings) -> list[tuple[str, Variant]]:
    return [
        ("MemoryMax", Variant("t", settings.allTasksMemoryMaxBytes)),
        ("TasksMax", Variant("t", settings.allTasksTasksMax)),
    ]


# Python isolated (-I: no PYTHON* variables, no user site-packages, hence no usercustomize or
# user .pth files, and neither the working directory nor a script's own on sys.path), so that
# nothing a task left in the workspace view runs as the next task's worker starts. What site
# still reads (the venv's and the system's site-packages) is root's. -u: unbuffered, as the
# PYTHONUNBUFFERED that -I ignores would have it, so the journal gets lines as they are printed.
PYTHON_FLAGS = ("-I", "-u")


# What a spare's worker, started ahead of its task, runs until it is told which worker to be.
AHEAD_MODULE = "boxd.workers.ahead"


def _python_module(module: str) -> list[str]:
    return [sys.executable, *PYTHON_FLAGS, "-m", module]


def worker_command(task: Task) -> list[str]:
    return _python_module(WORKERS[Worker(task.worker).value].module)


def wake_signal(task: Task) -> signal.Signals:
    """The signal that makes a worker started ahead run as this task's worker."""
    return WORKERS[Worker(task.worker).value].wake


def home_environment(own_home: Path) -> list[str]:
    """HOME and the XDG places under it: the task's own, never the shared view."""
    return [
        f"HOME={own_home}",
        f"XDG_CACHE_HOME={own_home / '.cache'}",
        f"XDG_CONFIG_HOME={own_home / '.config'}",
        f"XDG_DATA_HOME={own_home / '.local/share'}",
        f"XDG_STATE_HOME={own_home / '.local/state'}",
    ]


# How long systemd may take to start a worker (Type=exec: until its program is executed). Its
# default, 90 s, is for a box at rest: with a hundred tasks starting at once on two cores, the
# start jobs queued behind one another took longer, and systemd killed workers that had done
# nothing wrong, failing their tasks ("killed by SIGTERM"; found by bench/load.py). Bounded all
# the same, so a start that never completes still ends its task.
WORKER_START_SECONDS = 600


def broker_units(task_id: str) -> list[str]:
    """The task's broker and the sockets it serves: what its worker starts with, in one job."""
    return [
        broker_socket_unit(task_id),
        *egress_socket_units(task_id),
        model_socket_unit(task_id),
        broker_service_unit(task_id),
    ]


def worker_properties(home: Path, task: Task, settings: Settings) -> list[tuple[str, Variant]]:
    return _properties(home, task.id, worker_command(task), settings)


def ahead_worker_properties(
    home: Path, task_id: str, settings: Settings
) -> list[tuple[str, Variant]]:
    """The unit of a spare's worker, started before its task exists: the same as any task's
    worker's (so the unit a task gets does not depend on whether it took a spare), but for the
    program, which waits to be told which worker to be (boxd/workers/ahead.py)."""
    return _properties(home, task_id, _python_module(AHEAD_MODULE), settings)


def _properties(
    home: Path, task_id: str, command: list[str], settings: Settings
) -> list[tuple[str, Variant]]:
    work = str(task_work_dir(home, task_id))
    sockets = [unit for unit in broker_units(task_id) if unit.endswith(".socket")]
    return [
        # Not the title: any local user reads a unit's description (systemctl, systemd's
        # signals), and a task's content is for the owner only.
        ("Description", Variant("s", f"boxd task {task_id}")),
        ("Type", Variant("s", "exec")),
        # The broker and its sockets start in the same job as the worker: one call to systemd
        # for all six units. The worker waits for the sockets to listen, never for the broker,
        # whose start-up overlaps its own; its first connection waits in the socket meanwhile.
        # Wants, not Requires: a broker that crashes is restarted alone, and the worker goes on.
        ("Wants", Variant("as", broker_units(task_id))),
        ("After", Variant("as", sockets)),
        ("TimeoutStartUSec", Variant("t", WORKER_START_SECONDS * 1_000_000)),
        ("ExecStart", Variant("a(sasb)", [[command[0], command, False]])),
        ("RemainAfterExit", Variant("b", True)),
        ("User", Variant("s", task_user(task_id))),
        # Every task's files belong to group boxd-work and are group-writable, so a later
        # task can change what an earlier one, or the owner, left in the workspace.
        ("Group", Variant("s", WORK_GROUP)),
        ("UMask", Variant("u", 0o002)),
        ("Slice", Variant("s", task_slice(task_id))),
        ("WorkingDirectory", Variant("s", work)),
        (
            "Environment",
            Variant(
                "as",
                [
                    f"BOX_SOCKET={broker_socket(home, task_id)}",
                    f"BOX_TASK={task_id}",
                    f"BOX_MODEL_URL={MODEL_URL}",
                    *home_environment(task_own_home(home, task_id)),
                    *(
                        f"{name}={value}"
                        for name, value in proxy_environment(
                            HTTP_PROXY_PORT, SOCKS_PROXY_PORT
                        ).items()
                    ),
                ],
            ),
        ),
        *sandbox_properties(home, task_id, settings),
    ]
