"""The owner's mounted view of each workspace: `/run/boxd/views/<name>`, the base with every done
layer over it, read-only, exactly what the next task would see; for the owner's account and file
manager (group boxd-owner), never for tasks.

Why it is built so (docs/workspaces.md, "The owner's mounted view"): a first try bound the base
onto `BOX_HOME/views/<name>` and mounted overlays there. BOX_HOME sits on a shared mount (systemd
makes / shared), and a bind of a folder of a shared mount joins that mount's peer group: the
overlay later mounted on the view propagated back onto the base folder itself, so the next task
stacked the whole view again under its own layers. Here:

- the views live outside BOX_HOME, in a tmpfs of their own on `/run/boxd/views`, made private
  (MS_PRIVATE) before anything is mounted in it: a mount below it propagates nowhere, neither
  onto the bases nor into the workers' namespaces;
- nothing is ever bound: each view is an overlay of lower folders only (the done layers newest
  first, then the base), which is read-only by construction (no upper folder) and mounted `ro`
  too; with no done layer, an empty folder is the second lower, as overlayfs needs two;
- remade atomically: the new overlay is mounted on a fresh generation folder
  (`.gen/<random>`), then the symlink `<name>` is swapped to it with rename(2), then the old one
  is detached (MNT_DETACH): a file held open in it still reads;
- the gate: the tmpfs root is 0750 root:boxd-owner, so only root and boxd-owner enter; workers
  get an empty /run of their own (TemporaryFileSystem=, sandbox.py).

Blocking; the manager runs these in a thread under the workspace's `layers.joins` lock.
"""

import contextlib
import os
import secrets
import stat
from pathlib import Path

from boxd.manager.workspaces.workspaces import NAME, PERSONAL
from boxd.paths import workspaces_dir

VIEWS = Path("/run/boxd/views")
GATE_MODE = 0o750
GENERATIONS = ".gen"
EMPTY = ".empty"
# Overlay options besides the layers: no redirects or metacopy, as the tasks' views are mounted
# (layers.py), so it shows what they would; nothing in it runs, is a device or is set-id.
_OPTIONS = "ro,nosuid,nodev,noexec,redirect_dir=off,metacopy=off"


def shown(workspace: str) -> bool:
    """Whether the workspace gets a view. Not the copies of a member's personal folders: several
    members of boxd-owner share one box, and none of them gets another's files (folders.py);
    only the member who asked reviews and keeps such a task."""
    return NAME.fullmatch(workspace) is not None and not workspace.startswith(PERSONAL)


def mount_options(stack: list[str], base: str, empty: Path) -> str:
    """The overlay's options for the layer names `stack` (newest first, relative to the layer
    store, for the options' page limit) over `base`: lower folders only."""
    lowers = [*stack, base]
    if not stack:
        # overlayfs needs two lower folders when it has no upper one.
        lowers.append(str(empty))
    return f"{_OPTIONS},lowerdir={':'.join(lowers)}"


def mount_points(mountinfo: str) -> list[str]:
    """The mount points of a /proc/<pid>/mountinfo, their octal escapes decoded."""
    points = []
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            points.append(_unescape(fields[4]))
    return points


def _unescape(field: str) -> str:
    out, i = bytearray(), 0
    raw = field.encode()
    while i < len(raw):
        if raw[i] == 0x5C and len(raw[i + 1 : i + 4]) == 3 and raw[i + 1 : i + 4].isdigit():
            out.append(int(raw[i + 1 : i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return out.decode(errors="surrogateescape")


def propagation(mountinfo: str, point: str) -> str | None:
    """The optional fields ("shared:N", "master:N", none for private) of the topmost mount on
    `point`, or None when nothing is mounted there."""
    found = None
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) > 6 and _unescape(fields[4]) == point:
            optional = fields[6 : fields.index("-")]
            found = " ".join(optional)
    return found


def _mountinfo() -> str:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
        return table.read()


class OwnerViews:
    """The views under `root` of the workspaces whose bases are in `home`."""

    def __init__(self, home: Path, root: Path = VIEWS) -> None:
        self.home = home
        self.root = root

    def link(self, workspace: str) -> Path:
        return self.root / workspace

    def generations(self) -> Path:
        return self.root / GENERATIONS

    def gate_is_private(self) -> bool:
        """True once the views' tmpfs is mounted and private."""
        return propagation(_mountinfo(), str(self.root)) == ""

    def gate_commands(self, owner_gid: int) -> list[list[str]]:
        """What makes the gate, when it is not there yet: its own tmpfs, made private before
        anything is mounted in it. Only this first mount reaches the namespaces /run's own mount
        propagates to, and it is empty and closed."""
        commands = []
        if str(self.root) not in mount_points(_mountinfo()):
            # /run/boxd, passed through by all (the manager's umask would make it root's alone);
            # the gate is the tmpfs below it.
            self.root.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            os.chmod(self.root.parent, 0o755)
            self.root.mkdir(mode=0o755, exist_ok=True)
            commands.append(
                [
                    "mount",
                    "-t",
                    "tmpfs",
                    "-o",
                    f"mode={GATE_MODE:o},uid=0,gid={owner_gid},nosuid,nodev,noexec,size=1m",
                    "boxd-views",
                    str(self.root),
                ]
            )
        commands.append(["mount", "--make-private", str(self.root)])
        return commands

    def prepare(self) -> None:
        """The folders in the gate: generations, behind the gate, and the empty lower."""
        for name in (GENERATIONS, EMPTY):
            folder = self.root / name
            folder.mkdir(mode=0o755, exist_ok=True)
            os.chmod(folder, 0o755)

    def base(self, workspace: str) -> str:
        """BOX_HOME/workspaces/<name>, seen from the layer store BOX_HOME/layers/<name>."""
        return f"../../{workspaces_dir(self.home).name}/{workspace}"

    def new_generation(self) -> Path:
        folder = self.generations() / secrets.token_hex(8)
        folder.mkdir(mode=0o755)
        return folder

    def current(self, workspace: str) -> Path | None:
        """The generation the workspace's link points to, if any."""
        try:
            target = os.readlink(self.link(workspace))
        except (FileNotFoundError, OSError):
            return None
        return self.root / target

    def swap(self, workspace: str, generation: Path) -> Path | None:
        """Points the workspace's link at `generation` in one rename(2); returns the one it
        pointed to before."""
        old = self.current(workspace)
        temporary = self.root / f".{workspace}.{secrets.token_hex(4)}"
        os.symlink(f"{GENERATIONS}/{generation.name}", temporary)
        os.rename(temporary, self.link(workspace))
        return old

    def unlink(self, workspace: str) -> Path | None:
        old = self.current(workspace)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.link(workspace))
        return old

    def unused(self) -> list[Path]:
        """Generations no link points to: left by a remake cut off, or by a removed workspace."""
        used = set()
        for entry in os.scandir(self.root):
            if entry.is_symlink():
                used.add(os.path.basename(os.readlink(entry.path)))
        folder = self.generations()
        if not folder.is_dir():
            return []
        return [folder / name for name in os.listdir(folder) if name not in used]

    def stale_links(self, names: set[str]) -> list[str]:
        """Links of workspaces that are not in `names` any more."""
        return [
            entry.name
            for entry in os.scandir(self.root)
            if entry.is_symlink() and entry.name not in names
        ]

    @staticmethod
    def remove_generation(generation: Path) -> None:
        """Removes an unmounted generation folder; one still mounted (a detach that failed) is
        left, for the next start."""
        try:
            if stat.S_ISDIR(os.lstat(generation).st_mode) and not os.path.ismount(generation):
                os.rmdir(generation)
        except OSError:
            pass
