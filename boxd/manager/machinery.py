"""What the manager's parts that make, start and end tasks share (boxd.manager.spares, lifecycle,
ending): the box's home, its record, systemd, the layers and the owner's views of them, what a
task is given on the machine besides its units, the jobs that run in the background, and the
doctor, without whose yes no worker starts. Box makes it once; each part keeps its pieces under
their own names."""

from dataclasses import dataclass
from pathlib import Path

from boxd.manager.background import Background
from boxd.manager.doctor.gate import Doctor
from boxd.manager.record.store import Store
from boxd.manager.units.systemd import Systemd
from boxd.manager.units.task_os import TaskOS
from boxd.manager.view_mounts import ViewMounts
from boxd.manager.workspaces.layers import Layers


@dataclass(frozen=True)
class Machinery:
    home: Path
    store: Store
    systemd: Systemd
    layers: Layers
    task_os: TaskOS
    background: Background
    # The owner's mounted views, remade as stacks change.
    views: ViewMounts
    # Whether this machine can sandbox a task now: asked before any worker starts.
    doctor: Doctor


class OnMachinery:
    """A part of the manager that works with the Machinery, each piece under its own name."""

    def __init__(self, machinery: Machinery) -> None:
        self.machinery = machinery
        self.home = machinery.home
        self.store = machinery.store
        self.systemd = machinery.systemd
        self.layers = machinery.layers
        self.task_os = machinery.task_os
        self.background = machinery.background
        self.views = machinery.views
        self.doctor = machinery.doctor
