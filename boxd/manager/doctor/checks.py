"""`boxd doctor`'s checks of this machine: each tries, for real and briefly, what boxd needs of
it, and says in plain words what is missing and how to fix it.

The manager runs them as it starts, beside its own start (every check waits on a process or
runs in a thread, never on the event loop), and again on each `CheckMachine`; `boxd doctor`
runs them as root from the command line. Which ones block tasks, and why: boxd.wire.doctor
and docs/install.md.
"""

import asyncio
import errno
import logging
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Protocol

from dbus_fast import Variant
from dbus_fast.aio import MessageBus

from boxd.dbus.interface import BUS_NAME, MANAGE_ACTION
from boxd.dbus.polkit import installed_actions
from boxd.droid.release import VERSION, droid_binary
from boxd.errors import BoxError
from boxd.manager.access.vault import ENCRYPT
from boxd.manager.doctor import bpf_probe, leftovers
from boxd.manager.doctor.time_limit import CHECK_SECONDS, did_not_answer, stop, within
from boxd.manager.run import NotInstalled, Runner, complaint, run
from boxd.manager.units.netns import NETNS_DIR
from boxd.manager.units.sandbox import sandbox_properties
from boxd.manager.units.systemd import UnitStatus
from boxd.manager.units.worker_unit import all_tasks_properties
from boxd.manager.workspaces.layers import CLASSIC_MOUNT, MAX_DONE, layer_name, overlay_options
from boxd.wire.doctor import Finding, failed, passed
from boxd.wire.models.settings import Settings

log = logging.getLogger(__name__)

# Debian 12's: the oldest boxd is tested on, and the first with every sandbox option it sets.
OLDEST_SYSTEMD = 252
# Below this much free under BOX_HOME, the owner is told: a task's changes, layers and record
# grow there, and at none left steps and starts are refused (a 507).
LOW_DISK_BYTES = 1024**3
# Which cgroup controller enforces each limit boxd sets on a task's units.
CONTROLLER_OF = {"MemoryMax": "memory", "TasksMax": "pids", "CPUQuotaPerSecUSec": "cpu"}
# Where dbus-daemon reads the system bus's policies.
DBUS_POLICY_DIRS = (Path("/usr/share/dbus-1/system.d"), Path("/etc/dbus-1/system.d"))
_CGROUP = Path("/sys/fs/cgroup")
_CREDENTIAL = "boxd-doctor"
_IP_MISSING = "the command ip is not installed"
_INSTALL_IPROUTE = "apt install iproute2"


class ProbeSystemd(leftovers.Units, Protocol):
    async def version(self) -> str: ...

    async def run_to_end(self, name: str, properties: list[tuple[str, Variant]]) -> UnitStatus: ...


def needed_controllers() -> set[str]:
    """The controllers that enforce the limits on the units boxd makes for tasks, read from
    those units' properties."""
    settings = Settings()
    units = [
        *sandbox_properties(Path("/"), "t000000000", settings),
        *all_tasks_properties(settings),
    ]
    return {CONTROLLER_OF[name] for name, _ in units if name in CONTROLLER_OF}


@dataclass
class Seams:
    """What the checks touch of the machine; the unit tests give fakes of each."""

    home: Path
    systemd: ProbeSystemd
    # The ids of the actions polkit has read; raises when polkit does not answer.
    polkit_actions: Callable[[], Awaitable[list[str]]]
    run: Runner = run
    cgroup: Path = _CGROUP
    dbus_policy_dirs: tuple[Path, ...] = DBUS_POLICY_DIRS
    droid: Path = field(default_factory=droid_binary)
    free_bytes: Callable[[Path], int] = lambda path: _free(os.statvfs(path))
    # Names each trial (probe unit, namespace, stack of layers), unique to one run.
    token: Callable[[], str] = leftovers.token
    netns_dir: Path = NETNS_DIR
    # How long each check may take (and the clearing of what earlier runs left).
    check_seconds: float = CHECK_SECONDS


def on_this_machine(home: Path, bus: MessageBus, systemd: ProbeSystemd) -> Seams:
    return Seams(home, systemd, lambda: installed_actions(bus))


async def systemd_version(seams: Seams) -> Finding:
    name = "systemd"
    version = await seams.systemd.version()
    major = version.split(".")[0].split("-")[0].split("~")[0]
    if major.isdigit() and int(major) >= OLDEST_SYSTEMD:
        return passed(name, blocks=True)
    return failed(
        name,
        f"this machine runs systemd {version}; boxd's sandbox needs systemd {OLDEST_SYSTEMD} or "
        "newer, whose options it sets on every task (an older one refuses them or, worse, "
        "knows them by other meanings).",
        f"upgrade to Debian 12 or newer (systemd {OLDEST_SYSTEMD}+).",
        blocks=True,
    )


def _unified(cgroup: Path) -> Path | None:
    """The cgroup v2 hierarchy: all of /sys/fs/cgroup, or its `unified` part on a machine
    booted with both versions (a `hybrid` one)."""
    for place in (cgroup, cgroup / "unified"):
        if (place / "cgroup.controllers").exists():
            return place
    return None


async def cgroup_v2(seams: Seams) -> Finding:
    name = "cgroup v2"
    if await asyncio.to_thread(_unified, seams.cgroup) is not None:
        return passed(name, blocks=True)
    return failed(
        name,
        f"{seams.cgroup} has no cgroup v2 hierarchy: systemd attaches a task's network filter "
        "(IPAddressDeny=) to one, and keeps its processes together in it.",
        "boot with cgroup v2 (Debian's default; remove systemd.unified_cgroup_hierarchy=0 "
        "from the kernel's command line).",
        blocks=True,
    )


async def cgroup_controllers(seams: Seams) -> Finding:
    name = "cgroup controllers"
    needed = needed_controllers()

    def available() -> set[str]:
        unified = _unified(seams.cgroup)
        if unified is None:
            return set()
        return set((unified / "cgroup.controllers").read_text().split())

    missing = sorted(needed - await asyncio.to_thread(available))
    if not missing:
        return passed(name, blocks=False)
    return failed(
        name,
        f"cgroup v2 has no {', '.join(missing)} controller here, so the limits boxd sets on "
        "tasks (MemoryMax=, TasksMax=, CPUQuota=) are not enforced: a task stays in its "
        "sandbox, but could use up the machine's memory, processes or CPU.",
        "boot with cgroup v2 alone (no cgroup v1 hierarchies holding these controllers: "
        "Debian's default), or, in a container, delegate them to it.",
        blocks=False,
    )


async def overlayfs(seams: Seams) -> Finding:
    """Mounts an overlay of MAX_DONE + 1 lower layers, the deepest stack a task's view has,
    on BOX_HOME's own file system, where the views are made."""
    lowers = [layer_name(n) for n in range(MAX_DONE)] + ["base"]
    place = seams.home / f"{leftovers.STACK_PREFIX}{seams.token()}"

    def make() -> None:
        place.mkdir(mode=0o700)
        for sub in ("layers", "upper", "work", "view"):
            (place / sub).mkdir()
        for lower in lowers:
            (place / "layers" / lower).mkdir()

    # Its own task, so that a check stopped for its time removes the stack only once the
    # thread that makes it has done.
    making = asyncio.ensure_future(asyncio.to_thread(make))
    try:
        return await _try_overlay(seams, place, lowers, making)
    finally:
        await asyncio.wait({making})
        # Read, or asyncio would log it as never read when _try_overlay was stopped first.
        _ = making.exception()
        # Stopped for its time, the mount it ran may have been done all the same: rmtree
        # would empty the view, then leave it mounted.
        if await asyncio.to_thread(os.path.ismount, place / "view"):
            await complaint("umount", "--lazy", str(place / "view"), runner=seams.run)
        await asyncio.to_thread(shutil.rmtree, place, True)


async def _try_overlay(
    seams: Seams, place: Path, lowers: list[str], making: "asyncio.Future[None]"
) -> Finding:
    name = "overlayfs"
    try:
        await asyncio.shield(making)
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            # A full disk weakens no sandbox, and boxd refuses to start tasks on it in its own
            # words (507) until there is room: blocking here too would keep them refused once
            # room is back, until someone checked again.
            return failed(
                name,
                f"could not be tried: BOX_HOME ({seams.home}) is full.",
                "free space under BOX_HOME; then `boxctl doctor` tries it again.",
                blocks=False,
            )
        return failed(
            name,
            f"could not make a trial stack of layers under BOX_HOME ({seams.home}): "
            f"{error.strerror or error}.",
            "make sure BOX_HOME exists and has room (boxd makes it as it starts).",
            blocks=True,
        )
    options = overlay_options(lowers, place / "upper", place / "work")
    view = str(place / "view")
    # As a task's view is mounted (layers.mount_overlay): by mount(2), which takes 500 names.
    mounted = await complaint(
        *("mount", "-t", "overlay", "overlay", "-o", options, view),
        cwd=place / "layers",
        env=CLASSIC_MOUNT,
        runner=seams.run,
    )
    if mounted is None:
        await complaint("umount", view, runner=seams.run)
        return passed(name, blocks=True)
    return failed(
        name,
        f"overlayfs could not stack {len(lowers)} layers on BOX_HOME's file system "
        f"({seams.home}): {mounted}. Each task's view of its workspace is such a stack.",
        "use a kernel with overlayfs (modprobe overlay) and keep BOX_HOME on ext4, xfs or "
        "btrfs, not on a network or FUSE file system.",
        blocks=True,
    )


async def network_namespaces(seams: Seams) -> Finding:
    """Makes a network namespace with loopback up, as each task's is made, and removes it."""
    name = "network namespaces"
    netns = f"{leftovers.NETNS_PREFIX}{seams.token()}"
    made = await complaint("ip", "netns", "add", netns, runner=seams.run)
    if made is None:
        try:
            made = await complaint("ip", "-n", netns, "link", "set", "lo", "up", runner=seams.run)
        finally:
            # Stopped for its time too: the clearing of what runs left takes only those of a
            # manager gone, so this one's namespace would stay until boxd restarts.
            gone = await complaint("ip", "netns", "delete", netns, runner=seams.run)
        made = made or gone
    if made is None:
        return passed(name, blocks=True)
    fix = (
        _INSTALL_IPROUTE
        if made == _IP_MISSING
        else "use a kernel with network namespaces (CONFIG_NET_NS) and run boxd with "
        "CAP_SYS_ADMIN and CAP_NET_ADMIN (its unit gives them)."
    )
    return failed(
        name,
        f"could not make a network namespace with loopback up: {made}. Each task runs in one, "
        "its only way out through its broker.",
        fix,
        blocks=True,
    )


async def ip_address_deny(seams: Seams) -> Finding:
    unit = bpf_probe.unit_name(seams.token())
    try:
        status = await seams.systemd.run_to_end(unit, bpf_probe.properties())
    except Exception as error:
        return failed(
            bpf_probe.NAME,
            f"systemd could not run the unit that tries IPAddressDeny= ({_words(error)}), so "
            "whether a task's network filter works is unknown.",
            f"journalctl -u {unit} says why.",
            blocks=True,
        )
    return bpf_probe.verdict(status, unit)


async def credentials(seams: Seams) -> Finding:
    """Encrypts and decrypts a value the way the vault does (with the host's key)."""
    name = "systemd-creds"
    value = b"boxd doctor"
    named = f"--name={_CREDENTIAL}"
    why: str | None
    try:
        sealed = await seams.run(*ENCRYPT, named, "-", "-", input=value, keep_output=True)
        why = sealed.complaint
        if why is None:
            opened = await seams.run(
                "systemd-creds", "decrypt", named, "-", "-", input=sealed.stdout, keep_output=True
            )
            why = opened.complaint
            if why is None and opened.stdout != value:
                why = "what it decrypted is not what it encrypted"
    except NotInstalled as missing:
        why = str(missing)
    if why is None:
        return passed(name, blocks=True)
    return failed(
        name,
        f"systemd-creds could not encrypt and decrypt a secret with this machine's key: {why}. "
        "The vault keeps every secret so, and a task's tools and model gateway get them so.",
        "let systemd-creds make its key (/var/lib/systemd/credential.secret, root's alone, "
        "0400; remove a damaged one, and set the vault's secrets again), on systemd 250 or newer.",
        blocks=True,
    )


async def polkit(seams: Seams) -> Finding:
    name = "polkit"
    try:
        actions = await seams.polkit_actions()
    except BoxError as error:
        return failed(
            name,
            f"{error.message}: the box's owner cannot use boxctl, which asks polkit who may.",
            "apt install polkitd, and start it (systemctl start polkit).",
            blocks=False,
        )
    if MANAGE_ACTION in actions:
        return passed(name, blocks=False)
    return failed(
        name,
        f"polkit does not know boxd's action {MANAGE_ACTION}: boxctl is refused to everyone "
        "but root.",
        f"install boxd's polkit files again ({MANAGE_ACTION.rsplit('.', 1)[0]}.policy in "
        "/usr/share/polkit-1/actions): reinstall boxd.",
        blocks=False,
    )


async def dbus_policy(seams: Seams) -> Finding:
    name = "D-Bus policy"
    file = f"{BUS_NAME}.conf"
    found = [place / file for place in seams.dbus_policy_dirs]
    if any(await asyncio.to_thread(lambda: [path.is_file() for path in found])):
        return passed(name, blocks=False)
    return failed(
        name,
        f"the system bus has no policy for {BUS_NAME} ({found[0]} is missing): boxd cannot "
        "own its name, and the web gateway, boxctl and brokers cannot reach it.",
        "reinstall boxd, then systemctl reload dbus.",
        blocks=False,
    )


async def disk_space(seams: Seams) -> Finding:
    name = "disk space"
    try:
        free = await asyncio.to_thread(seams.free_bytes, seams.home)
    except OSError as error:
        return failed(
            name,
            f"could not read BOX_HOME ({seams.home}): {error.strerror or error}.",
            "make sure BOX_HOME exists (boxd makes it as it starts).",
            blocks=False,
        )
    if free >= LOW_DISK_BYTES:
        return passed(name, blocks=False)
    return failed(
        name,
        f"only {free // 2**20} MiB are free under BOX_HOME ({seams.home}): tasks' changes, "
        "layers and the record grow there, and with none left new steps and tasks are refused.",
        "free space there (undo tasks or remove workspaces you no longer need), or give BOX_HOME "
        f"a larger disk: at least {LOW_DISK_BYTES // 2**30} GiB free.",
        blocks=False,
    )


async def droid(seams: Seams) -> Finding:
    name = "Droid"
    if await asyncio.to_thread(os.access, seams.droid, os.X_OK):
        return passed(name, blocks=False)
    return failed(
        name,
        f"Droid {VERSION} is not installed ({seams.droid}): Droid tasks wait for it, or fail "
        "saying why if its install failed. fake tasks run.",
        "boxd installs it as it starts (boxd-droid-install.service, from npm); boxctl droid "
        "says how that goes, and systemctl restart boxd tries again.",
        blocks=False,
    )


@dataclass(frozen=True)
class Check:
    """One check: its name and whether its failing blocks tasks, as its findings say (the unit
    tests hold them to it), and where to look when it does not answer in time."""

    test: Callable[[Seams], Awaitable[Finding]]
    name: str
    blocks: bool
    look: str


_BOX_HOME_STUCK = (
    "BOX_HOME's file system, which may not answer (findmnt -T BOX_HOME; dmesg) and processes "
    "stuck on it (ps -eo pid,stat,args: state D)"
)
CHECKS = (
    Check(
        systemd_version,
        "systemd",
        True,
        "whether systemd answers on the system bus (systemctl status; journalctl -b -u dbus)",
    ),
    Check(cgroup_v2, "cgroup v2", True, "whether /sys/fs/cgroup can be read (dmesg)"),
    Check(
        cgroup_controllers,
        "cgroup controllers",
        False,
        "whether /sys/fs/cgroup/cgroup.controllers can be read (dmesg)",
    ),
    Check(
        overlayfs,
        "overlayfs",
        True,
        "a mount or umount that hangs (ps -eo pid,stat,args | grep mount: state D) and "
        "BOX_HOME's file system (findmnt -T BOX_HOME; dmesg)",
    ),
    Check(
        network_namespaces,
        "network namespaces",
        True,
        "ip netns commands that hang (ps -eo pid,stat,args | grep 'ip '; dmesg)",
    ),
    Check(
        ip_address_deny,
        bpf_probe.NAME,
        True,
        f"systemd's jobs and the probe unit (systemctl list-jobs; journalctl -u "
        f"'{bpf_probe.unit_name('*')}')",
    ),
    Check(
        credentials,
        "systemd-creds",
        True,
        "systemd-creds, which may wait for the TPM (journalctl -b | grep -i tpm)",
    ),
    Check(polkit, "polkit", False, "whether polkit answers (systemctl status polkit)"),
    Check(
        dbus_policy,
        "D-Bus policy",
        False,
        "whether /usr/share/dbus-1 and /etc/dbus-1 can be read (dmesg)",
    ),
    Check(disk_space, "disk space", False, _BOX_HOME_STUCK),
    Check(droid, "Droid", False, "the file system Droid is installed on (dmesg)"),
)


async def run_checks(seams: Seams) -> list[Finding]:
    """Every check at once, in CHECKS' order, each held to seams.check_seconds; a check that
    breaks is a failure in its words, one that does not answer in time a failure that says so.
    First what runs cut off left goes, held to the same time."""
    clearing = leftovers.clear(
        seams.home, seams.systemd, partial(complaint, runner=seams.run), netns_dir=seams.netns_dir
    )
    try:
        await within(seams.check_seconds, clearing)
    except Exception as error:
        log.warning("could not clear what earlier checks of this machine left: %s", error)
    tasks = [asyncio.ensure_future(check.test(seams)) for check in CHECKS]
    try:
        await asyncio.wait(tasks, timeout=seams.check_seconds)
    finally:
        late = [not task.done() for task in tasks]
        for task in tasks:
            stop(task)
    findings = []
    for check, task, timed_out in zip(CHECKS, tasks, late, strict=True):
        if timed_out:
            finding = did_not_answer(
                check.name, seams.check_seconds, check.look, blocks=check.blocks
            )
        elif (broke := task.exception()) is not None:
            if not isinstance(broke, Exception):
                raise broke
            finding = failed(
                check.name,
                f"the check itself failed: {_words(broke)}.",
                "run boxd doctor as root to see it again; the journal of boxd.service has more.",
                blocks=True,
            )
        else:
            finding = task.result()
        findings.append(finding)
    return findings


def _free(stats: os.statvfs_result) -> int:
    """What an unprivileged writer may still use: root's reserve is not the tasks'."""
    return stats.f_bavail * stats.f_frsize


def _words(error: BaseException) -> str:
    if isinstance(error, BoxError):
        return error.message
    return str(error) or type(error).__name__
