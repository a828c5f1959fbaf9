"""The transient service a task's worker runs in, `box-task-<id>.service`.

A service, not a scope: systemd refuses sandboxing properties on scopes. RemainAfterExit keeps
the unit, with its exit status, loaded until the manager has recorded the result, even if the
manager was down when the worker exited (systemd 252 has no AddRef for transient units).
"""

import sys
from pathlib import Path

from dbus_fast import Variant

from boxd.broker.proxy_environment import proxy_environment
from boxd.ids import task_user
from boxd.manager.netns import HTTP_PROXY_PORT, SOCKS_PROXY_PORT
from boxd.manager.sandbox import sandbox_properties
from boxd.paths import broker_socket, task_work_dir
from boxd.settings import Settings
from boxd.task import Task
from boxd.task_request import Worker

WORK_GROUP = "boxd-work"


def worker_unit(task_id: str) -> str:
    return f"box-task-{task_id}.service"


def broker_socket_unit(task_id: str) -> str:
    return f"box-broker@{task_id}.socket"


def egress_socket_units(task_id: str) -> list[str]:
    """The task's proxy sockets, bound inside its network namespace, served by its broker."""
    return [f"box-egress-http@{task_id}.socket", f"box-egress-socks@{task_id}.socket"]


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


def worker_command(task: Task) -> list[str]:
    if task.worker == Worker.FAKE:
        return [sys.executable, "-m", "boxd.workers.fake"]
    raise ValueError(f"no command for worker {task.worker}")


def worker_properties(home: Path, task: Task, settings: Settings) -> list[tuple[str, Variant]]:
    work = str(task_work_dir(home, task.id))
    command = worker_command(task)
    return [
        # Not the title: any local user reads a unit's description (systemctl, systemd's
        # signals), and a task's content is for the owner only.
        ("Description", Variant("s", f"boxd task {task.id}")),
        ("Type", Variant("s", "exec")),
        ("ExecStart", Variant("a(sasb)", [[command[0], command, False]])),
        ("RemainAfterExit", Variant("b", True)),
        ("User", Variant("s", task_user(task.id))),
        # Every task's files belong to group boxd-work and are group-writable, so a later
        # task can change what an earlier one, or the owner, left in the workspace.
        ("Group", Variant("s", WORK_GROUP)),
        ("UMask", Variant("u", 0o002)),
        ("Slice", Variant("s", task_slice(task.id))),
        ("WorkingDirectory", Variant("s", work)),
        (
            "Environment",
            Variant(
                "as",
                [
                    f"BOX_SOCKET={broker_socket(home, task.id)}",
                    f"BOX_TASK={task.id}",
                    f"HOME={work}",
                    "PYTHONUNBUFFERED=1",
                    *(
                        f"{name}={value}"
                        for name, value in proxy_environment(
                            HTTP_PROXY_PORT, SOCKS_PROXY_PORT
                        ).items()
                    ),
                ],
            ),
        ),
        *sandbox_properties(home, task.id, settings),
    ]
