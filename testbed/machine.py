"""A throwaway machine running a real systemd, booted with systemd-nspawn from the test image.

    with Machine() as m:
        install_boxd(m)
        print(m.run("systemctl", "is-active", "boxd.service").stdout)

The machine's root is an overlay: the cached image below, a per-machine directory on disk on
top. `/var/lib/box` is a bind of a fresh host directory (a real ext4 directory, so boxd can stack
its own overlayfs layers there). Both live until `stop()`; `kill()` keeps them, so `start()`
afterwards boots the same machine again, as after a power cut.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from .deb_package import built_deb
from .droid_cache import MACHINE_DIR as DROID_CACHE
from .droid_cache import droid_cache_dir
from .image import CONTAINER_PATH, ensure_host_tools, image

STATE_PARENT = Path("/var/tmp")
STATE_PREFIX = "boxd-machine-"
# A stale machine's state once a sweeping process has claimed it (named with that process's pid).
SWEPT_PREFIX = ".boxd-machine-swept-"
CGROUP_DIR = "boxd-test"
BOX_HOME = "/var/lib/box"

Bind = tuple[str | Path, str, bool]
Stream = int | IO[str] | None


class MachineError(RuntimeError):
    pass


class CommandError(MachineError):
    """A command inside the machine failed or did not finish in time."""

    def __init__(self, argv: Sequence[str], message: str, stdout: str, stderr: str) -> None:
        self.argv = list(argv)
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(
            f"{' '.join(argv)!r} {message}\n"
            f"--- stdout ---\n{stdout.rstrip()}\n--- stderr ---\n{stderr.rstrip()}"
        )


def log(message: str) -> None:
    print(f"[boxd-test machine] {message}", file=sys.stderr, flush=True)


def _process_group(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        # Fields after the command name, which may itself hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


class MachineProcess(subprocess.Popen[str]):
    """A process started in the machine by nsenter.

    nsenter forks to enter the PID namespace and does not pass signals on to its child, so a
    signal goes to everything nsenter started (its own process group) but not to nsenter: if
    nsenter died first, its child would be left a zombie of the host's PID 1, which systemd in
    the machine then waits for in vain when it shuts down. nsenter exits once its child has.
    """

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            return
        for pid in _process_group(self.pid):
            if pid != self.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)


def _escape_bind(path: str) -> str:
    # systemd-nspawn splits --bind= on colons and reads backslash escapes.
    return path.replace("\\", "\\\\").replace(":", "\\:")


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path)
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return found


def _systemd_cgroup_mounts() -> list[Path]:
    """The cgroup hierarchies that systemd in a machine manages: cgroup2 and name=systemd."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            before, _, after = line.partition(" - ")
            fstype, _, options = after.split()[:3]
            if fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in options):
                found.append(Path(before.split()[4]))
    return found


def _cgroup_busy(top: Path) -> bool:
    if not top.exists():
        return False
    for d in [top, *top.rglob("*")]:
        procs = d / "cgroup.procs"
        if d.is_dir() and procs.exists() and procs.read_text().strip():
            return True
    return False


def _remove_cgroup(top: Path, tries: int = 50) -> bool:
    # A cgroup is removed with rmdir, deepest first; its files cannot be deleted.
    for _ in range(tries):
        if not top.exists():
            return True
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        try:
            for d in [*dirs, top]:
                d.rmdir()
        except OSError:
            # Busy while the last processes in it finish dying.
            time.sleep(0.1)
    log(f"could not remove cgroup {top}")
    return False


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rindex(")") + 2 :].split()[19]


def _sweep_stale_machines() -> None:
    """Remove what machines of harness processes that died without stopping them left."""
    for state in STATE_PARENT.glob(f"{STATE_PREFIX}*"):
        try:
            pid, started, name = (state / "owner").read_text().split()
        except (FileNotFoundError, ValueError):
            continue
        if _start_time(int(pid)) == started:
            continue
        cgroups = [m / CGROUP_DIR / name for m in _systemd_cgroup_mounts()]
        # nspawn got SIGTERM when its harness died; processes left means it is still stopping.
        if any(_cgroup_busy(c) for c in cgroups):
            continue
        # Claimed by a rename first: two harness processes starting at once both find it stale,
        # and the second one's rmtree failed on files the first had just removed.
        claimed = state.with_name(f"{SWEPT_PREFIX}{os.getpid()}-{state.name}")
        try:
            state.rename(claimed)
        except FileNotFoundError:
            continue
        log(f"removing machine {name}, left behind by process {pid}")
        for cgroup in cgroups:
            _remove_cgroup(cgroup)
        _remove_swept(claimed)
    # What a sweeping process that died meanwhile had claimed.
    for claimed in STATE_PARENT.glob(f"{SWEPT_PREFIX}*"):
        sweeper = claimed.name.removeprefix(SWEPT_PREFIX).split("-", 1)[0]
        if sweeper.isdigit() and not Path(f"/proc/{sweeper}").exists():
            _remove_swept(claimed)


def _remove_swept(claimed: Path) -> None:
    for point in sorted(_mounts_under(claimed), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False)
    if not _mounts_under(claimed):
        shutil.rmtree(claimed, ignore_errors=True)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return found


class Machine:
    def __init__(
        self,
        *,
        image_root: Path | None = None,
        private_network: bool = True,
        binds: Iterable[Bind] = (),
        name: str | None = None,
        bpf: bool = True,
        host_network_admin: bool = False,
    ) -> None:
        self.name = name or f"boxd-test-{secrets.token_hex(4)}"
        # Whether its processes may call bpf(): without it, systemd silently ignores
        # IPAddressDeny= in it (what tests/vm/test_doctor.py shows boxd refuses to run with).
        # Read at each start, so a test may boot the same machine again with it changed.
        self.bpf = bpf
        self.private_network = private_network
        # On the host's network (private_network=False), CAP_NET_ADMIN would be over the host's
        # own interfaces, routes, firewall and 127.0.0.1: what a test installs there (apt's
        # postinsts, boxd, its tasks) could change or break the CI host's network. Such a
        # machine gets it only when asked, for `make run` on a person's own computer. Read at
        # each start, as private_network is.
        self.host_network_admin = host_network_admin
        self.binds: list[Bind] = list(binds)
        self._image_root = image_root
        self._state: Path | None = None
        self._nspawn: subprocess.Popen[bytes] | None = None
        self._leader: int | None = None
        self._spawned: list[MachineProcess] = []
        self._cgroups: list[Path] = []

    # --- where things are -------------------------------------------------------------------

    @property
    def leader(self) -> int:
        """The host PID of the machine's PID 1 (its systemd)."""
        if self._leader is None:
            raise MachineError(f"machine {self.name} is not running")
        return self._leader

    @property
    def root(self) -> Path:
        """The machine's root directory as its PID 1 sees it, mounts included, from the host."""
        return Path(f"/proc/{self.leader}/root")

    @property
    def state_dir(self) -> Path:
        if self._state is None:
            raise MachineError(f"machine {self.name} has never been started")
        return self._state

    @property
    def home(self) -> Path:
        """The host directory that the machine sees as /var/lib/box."""
        return self.state_dir / "home"

    @property
    def console_log(self) -> Path:
        return self.state_dir / "console.log"

    @property
    def running(self) -> bool:
        return self._nspawn is not None and self._nspawn.poll() is None

    # --- life -------------------------------------------------------------------------------

    def __enter__(self) -> Machine:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, timeout: float = 90) -> Machine:
        """Boot the machine and return once systemd reports `running` or `degraded`."""
        if self.running:
            raise MachineError(f"machine {self.name} is already running")
        ensure_host_tools()
        if self._image_root is None:
            self._image_root = image()
        if self._state is None:
            _sweep_stale_machines()
            self._state = Path(
                tempfile.mkdtemp(prefix=f"{STATE_PREFIX}{self.name}-", dir=STATE_PARENT)
            )
            (self._state / "owner").write_text(
                f"{os.getpid()} {_start_time(os.getpid())} {self.name}\n"
            )
            for sub in ("home", "upper", "work", "root"):
                (self._state / sub).mkdir()
            # The machine's services (e.g. DynamicUser ones) must be able to get into it.
            (self._state / "home").chmod(0o755)
        root = self.state_dir / "root"
        if not _mounts_under(root):
            options = (
                f"lowerdir={self._image_root},upperdir={self.state_dir / 'upper'},"
                f"workdir={self.state_dir / 'work'}"
            )
            mount = ["mount", "-t", "overlay", "overlay", "-o", options, str(root)]
            done = subprocess.run(mount, capture_output=True, text=True)
            if done.returncode != 0:
                raise MachineError(
                    f"could not mount the root of machine {self.name}: {' '.join(mount)} "
                    f"exited with status {done.returncode}: {done.stderr.strip()}"
                )
        argv = [
            "systemd-nspawn",
            "--quiet",
            "--boot",
            f"--directory={root}",
            f"--machine={self.name}",
            # Required on a host whose PID 1 is not systemd: there is no machined to register
            # with and no manager to make a scope unit.
            "--register=no",
            "--keep-unit",
            "--console=passive",
            "--link-journal=no",
            # quotactl_fd: boxd asks the kernel whether BOX_HOME keeps project quotas.
            f"--system-call-filter={'bpf ' if self.bpf else ''}quotactl_fd",
            f"--bind={_escape_bind(str(self.home))}:{BOX_HOME}",
            # For testbed/npm_registry.py to serve Droid from, without the network.
            f"--bind-ro={_escape_bind(str(droid_cache_dir()))}:{DROID_CACHE}",
        ]
        if self.private_network:
            argv.append("--private-network")
        if self.private_network or self.host_network_admin:
            # For IPAddressDeny= and for loopback in the namespaces tests make inside.
            argv.append("--capability=CAP_NET_ADMIN")
        for host_path, machine_path, read_only in self.binds:
            option = "--bind-ro" if read_only else "--bind"
            argv.append(f"{option}={_escape_bind(str(host_path))}:{_escape_bind(machine_path)}")
        # nspawn puts the machine in a "payload" cgroup beside its own, below the cgroup it was
        # started in. Started from the host's root cgroup, every machine would share one
        # /payload, and their systemds would manage the same system.slice. So each machine's
        # nspawn starts in a cgroup of its own.
        self._cgroups = [m / CGROUP_DIR / self.name for m in _systemd_cgroup_mounts()]
        for cgroup in self._cgroups:
            cgroup.mkdir(parents=True, exist_ok=True)
        procs = [str(cgroup / "cgroup.procs") for cgroup in self._cgroups]
        # Writing "0" moves the writing process, here nspawn just before it execs.
        join = 'for p in "$@"; do [ "$p" = -- ] && break; echo 0 > "$p" || exit 1; done'
        # If the harness dies without stopping it (SIGKILL, a closed terminal), nspawn gets
        # SIGTERM and shuts the machine down instead of running on, orphaned.
        pdeathsig = "exec setpriv --pdeathsig TERM --"
        wrapped = ["sh", "-c", f'{join}; shift $(($# - {len(argv)})); {pdeathsig} "$@"', "sh"]
        started = time.monotonic()
        with self.console_log.open("ab") as console:
            # Its own session, so a Ctrl-C in the terminal reaches the harness, which then
            # shuts the machine down in order, and not nspawn directly.
            self._nspawn = subprocess.Popen(
                [*wrapped, *procs, "--", *argv],
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._leader = self._find_leader(deadline=started + timeout)
            self._wait_until_booted(deadline=started + timeout)
        except BaseException:
            self.kill()
            raise
        log(f"{self.name} booted in {time.monotonic() - started:.1f} s (leader pid {self._leader})")
        return self

    def _console_tail(self, lines: int = 40) -> str:
        try:
            text = self.console_log.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _find_leader(self, deadline: float) -> int:
        # nspawn's first child sets up the mounts and forks the container's PID 1, which then
        # execs systemd; only after that exec is the machine's mount namespace complete.
        assert self._nspawn is not None
        own_pidns = os.readlink("/proc/self/ns/pid")
        while time.monotonic() < deadline:
            if self._nspawn.poll() is not None:
                raise MachineError(
                    f"systemd-nspawn exited with status {self._nspawn.returncode} before the "
                    f"machine booted. Its output:\n{self._console_tail()}"
                )
            for child in _children(self._nspawn.pid):
                try:
                    comm = Path(f"/proc/{child}/comm").read_text().strip()
                    pidns = os.readlink(f"/proc/{child}/ns/pid")
                except (FileNotFoundError, ProcessLookupError):
                    continue
                if comm == "systemd" and pidns != own_pidns:
                    return child
            time.sleep(0.02)
        raise MachineError(
            f"machine {self.name} did not start systemd in time. "
            f"nspawn's output:\n{self._console_tail()}"
        )

    def _wait_until_booted(self, deadline: float) -> None:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if not self.running:
                raise MachineError(
                    f"machine {self.name} stopped while booting. Its console:\n"
                    f"{self._console_tail()}"
                )
            try:
                # Fails fast with "offline" until systemd's private socket exists.
                done = self.run(
                    "systemctl", "is-system-running", "--wait", check=False, timeout=remaining
                )
            except CommandError:
                break
            state = done.stdout.strip()
            if state == "running":
                return
            if state == "degraded":
                failed = self.run("systemctl", "--failed", "--no-pager", check=False).stdout
                log(f"{self.name} booted degraded; failed units:\n{failed.rstrip()}")
                return
            if state == "maintenance":
                raise MachineError(
                    f"machine {self.name} booted into maintenance mode. Its "
                    f"console:\n{self._console_tail()}"
                )
            time.sleep(0.05)
        raise MachineError(
            f"machine {self.name} did not finish booting in time. Its console:\n"
            f"{self._console_tail()}"
        )

    def stop(self, timeout: float = 10, *, keep_state: bool = False) -> None:
        """Shut the machine down cleanly (SIGKILL after `timeout` s), then delete its disks.

        With keep_state=True its root and /var/lib/box stay, and start() boots it again.
        """
        if self.running:
            assert self._nspawn is not None
            # nspawn turns SIGTERM into an orderly shutdown request to the machine's systemd.
            self._nspawn.send_signal(signal.SIGTERM)
            try:
                self._nspawn.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"{self.name} did not shut down within {timeout:.0f} s; killing it")
        self.kill()
        if not keep_state:
            self._remove_state()

    def kill(self) -> None:
        """Kill the whole machine at once, like pulling its power. Its disks stay."""
        if self._nspawn is not None:
            if self._nspawn.poll() is None:
                # When a PID namespace's init dies the kernel kills everything in it; nspawn
                # then sees its child gone and cleans up after itself.
                if self._leader is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self._leader, signal.SIGKILL)
                else:
                    # Not booted far enough to have a PID 1: nspawn's own children die with it.
                    os.killpg(self._nspawn.pid, signal.SIGKILL)
                try:
                    self._nspawn.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(self._nspawn.pid, signal.SIGKILL)
                    self._nspawn.wait()
            self._nspawn = None
        self._leader = None
        for process in self._spawned:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._spawned.clear()
        for cgroup in self._cgroups:
            _remove_cgroup(cgroup)
        self._cgroups = []
        if self._state is not None:
            root = self._state / "root"
            if _mounts_under(root):
                subprocess.run(["umount", str(root)], check=False)

    def _remove_state(self) -> None:
        if self._state is None:
            return
        leftover = _mounts_under(self._state)
        for point in sorted(leftover, key=len, reverse=True):
            subprocess.run(["umount", "--lazy", point], check=False)
        if _mounts_under(self._state):
            # Deleting through a mount would delete whatever is mounted there.
            raise MachineError(f"{self._state} still has mounts in it; left it in place")
        shutil.rmtree(self._state)
        self._state = None

    # --- commands ---------------------------------------------------------------------------

    def command(
        self, *argv: str, user: str | None = None, env: dict[str, str] | None = None
    ) -> list[str]:
        """The host argv that runs `argv` inside the machine with a clean environment."""
        if not argv:
            raise ValueError("no command given")
        full = [
            "nsenter",
            "-t",
            str(self.leader),
            "-a",
            "env",
            "-i",
            f"PATH={CONTAINER_PATH}",
            "LANG=C.UTF-8",
        ]
        if user is None:
            full.append("HOME=/root")
        full += [f"{key}={value}" for key, value in (env or {}).items()]
        if user is not None:
            full += ["runuser", "-u", user, "--"]
        return full + list(argv)

    def run(
        self,
        *argv: str,
        user: str | None = None,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside the machine and wait for it; stdout and stderr are captured."""
        full = self.command(*argv, user=user, env=env)
        with MachineProcess(
            full,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            # Binary output (a database file, say) must not crash the harness.
            errors="replace",
            start_new_session=True,
        ) as process:
            try:
                stdout, stderr = process.communicate(input, timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, stderr = process.communicate()
                raise CommandError(
                    argv,
                    f"did not finish within {timeout:g} s in machine {self.name}",
                    stdout,
                    stderr,
                ) from None
        if check and process.returncode != 0:
            who = f" as {user}" if user else ""
            raise CommandError(
                argv,
                f"exited with status {process.returncode}{who} in machine {self.name}",
                stdout,
                stderr,
            )
        return subprocess.CompletedProcess(list(argv), process.returncode, stdout, stderr)

    def spawn(
        self,
        *argv: str,
        user: str | None = None,
        env: dict[str, str] | None = None,
        stdout: Stream = subprocess.PIPE,
        stderr: Stream = subprocess.PIPE,
    ) -> MachineProcess:
        """Start a long-running command inside the machine; the caller reads and waits on it.

        terminate()/kill() on the result reach the command inside, not just nsenter. The
        process dies with the machine at the latest.
        """
        process = MachineProcess(
            self.command(*argv, user=user, env=env),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
        )
        self._spawned.append(process)
        return process

    def journal(self, lines: int = 200) -> str:
        done = self.run("journalctl", "-b", "--no-pager", "-n", str(lines), check=False, timeout=30)
        return done.stdout + done.stderr


# --- installing boxd ----------------------------------------------------------------------------


def stage_deb(m: Machine, version: str | None = None) -> str:
    """This checkout's package (debian/make-deb, at `version`) in the machine's /tmp, as a
    person would have downloaded it: its path there. Again after the machine booted again (its
    /tmp is a tmpfs)."""
    deb = built_deb(version)
    # Through /proc/<leader>/root the host writes into the machine's own /tmp (a tmpfs that
    # only exists in the machine's mount namespace).
    target = m.root / "tmp" / deb.name
    shutil.copyfile(deb, target)
    target.chmod(0o644)
    return f"/tmp/{deb.name}"


def apt_install(m: Machine, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """apt-get install in the machine, which has no network: what it installs must be in the
    image or named by path."""
    return m.run(
        "apt-get",
        "install",
        "-y",
        "-q",
        "--no-install-recommends",
        *argv,
        env={"DEBIAN_FRONTEND": "noninteractive"},
        timeout=timeout,
    )


def wait_active(m: Machine, unit: str, timeout: float, after: str) -> None:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = m.run("systemctl", "is-active", unit, check=False).stdout.strip()
        if state == "active":
            return
        if state == "failed":
            break
        time.sleep(0.2)
    status = m.run("systemctl", "status", "--no-pager", "-l", unit, check=False)
    journal = m.run("journalctl", "-b", "--no-pager", "-n", "60", "-u", unit, check=False)
    raise MachineError(
        f"{unit} is {state or 'not active'} {timeout:g} s after {after}.\n"
        f"{status.stdout}\n{journal.stdout}"
    )


def install_boxd(m: Machine, *, active_timeout: float = 20, version: str | None = None) -> None:
    """Install this checkout's package into the machine with apt and wait for boxd."""
    deb = stage_deb(m, version)
    started = time.monotonic()
    apt_install(m, deb)
    wait_active(m, "boxd.service", active_timeout, f"apt-get install {deb}")
    log(f"boxd installed and active in {time.monotonic() - started:.1f} s")


def booted_box(*, bpf: bool = True) -> Iterator[Machine]:
    """A booted machine with this checkout of boxd installed and boxd.service active, stopped
    at the end. Also for modules that need a machine of their own (`scope="module"`)."""
    m = Machine(bpf=bpf)
    m.start()
    try:
        install_boxd(m)
        yield m
    finally:
        m.stop()
