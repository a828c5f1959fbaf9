"""Each check of boxd doctor against fakes of what it touches: systemd, the commands it runs,
polkit, /sys/fs/cgroup, the disk. Whether they hold on a real machine: tests/vm/test_doctor.py."""

import asyncio
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import Variant

from boxd.dbus.interface import MANAGE_ACTION
from boxd.errors import BoxError, Problem
from boxd.manager.doctor import bpf_probe, checks
from boxd.manager.doctor.checks import Check, Seams, needed_controllers, run_checks
from boxd.manager.run import NotInstalled, Ran
from boxd.manager.units.systemd import CLD_EXITED, CLD_KILLED, UnitStatus
from boxd.manager.workspaces.layers import MAX_DONE
from boxd.wire.doctor import Finding

Answer = Callable[[tuple[str, ...], bytes | None], Ran]


def _ran(argv: tuple[str, ...], status: int = 0, stdout: bytes = b"", stderr: bytes = b"") -> Ran:
    return Ran(argv[0], status, stdout, stderr)


class FakeRun:
    """Runs nothing: answers each command as `answer` says, and keeps what was asked."""

    def __init__(self, answer: Answer = lambda argv, given: _ran(argv)) -> None:
        self.answer = answer
        self.asked: list[tuple[tuple[str, ...], Path | None, bytes | None]] = []

    async def __call__(
        self, *argv: str, cwd: Path | None = None, input: bytes | None = None, **_: Any
    ) -> Ran:
        # As boxd.manager.run.run is called; what it is given beyond these, it keeps not.
        self.asked.append((argv, cwd, input))
        return self.answer(argv, input)


class FakeSystemd:
    def __init__(self, version: str = "252.39-1~deb12u2", probe: UnitStatus | None = None) -> None:
        self._version = version
        self.probe = probe or _exited(bpf_probe.REFUSED)
        self.ran: list[tuple[str, list[tuple[str, Variant]]]] = []

    async def version(self) -> str:
        return self._version

    async def loaded_units(self, pattern: str) -> list[str]:
        return []

    async def stop_unit(self, name: str) -> None:
        raise AssertionError(f"no unit is left to stop, yet {name} was")

    async def reset_failed(self, name: str) -> None:
        raise AssertionError(f"no unit is left to reset, yet {name} was")

    async def run_to_end(self, name: str, properties: list[tuple[str, Variant]]) -> UnitStatus:
        self.ran.append((name, properties))
        return self.probe


def _exited(status: int, code: int = CLD_EXITED) -> UnitStatus:
    return UnitStatus("active", "exited", "success" if status == 0 else "exit-code", code, status)


async def _actions() -> list[str]:
    return [MANAGE_ACTION, "org.freedesktop.login1.reboot"]


@pytest.fixture
def seams(tmp_path: Path) -> Seams:
    home = tmp_path / "home"
    home.mkdir()
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    policy = tmp_path / "dbus"
    policy.mkdir()
    (policy / "org.boxd.Box1.conf").write_text("<busconfig/>")
    droid = tmp_path / "droid"
    droid.write_text("#!/bin/sh\n")
    droid.chmod(0o755)
    return Seams(
        home,
        FakeSystemd(),
        _actions,
        run=FakeRun(_works),
        cgroup=cgroup,
        dbus_policy_dirs=(tmp_path / "nowhere", policy),
        droid=droid,
        free_bytes=lambda path: 50 * 2**30,
        token=lambda: "abcd1234",
        netns_dir=tmp_path / "netns",
    )


def _works(argv: tuple[str, ...], given: bytes | None) -> Ran:
    if argv[0] == "systemd-creds":
        return _sealing(b"boxd doctor")(argv, given)
    return _ran(argv)


def _failed(finding: Finding, *words: str) -> None:
    assert not finding.ok
    for word in words:
        assert word in finding.problem + " " + finding.fix


async def test_a_machine_with_all_it_needs_passes_every_check(seams: Seams) -> None:
    findings = await run_checks(seams)
    assert [f for f in findings if not f.ok] == []
    assert [f.name for f in findings] == [
        "systemd",
        "cgroup v2",
        "cgroup controllers",
        "overlayfs",
        "network namespaces",
        "IPAddressDeny (BPF)",
        "systemd-creds",
        "polkit",
        "D-Bus policy",
        "disk space",
        "Droid",
    ]


async def test_what_blocks_tasks_is_what_guards_the_sandbox(seams: Seams) -> None:
    blocking = {f.name for f in await run_checks(seams) if f.blocks}
    assert blocking == {
        "systemd",
        "cgroup v2",
        "overlayfs",
        "network namespaces",
        "IPAddressDeny (BPF)",
        "systemd-creds",
    }


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("252.39-1~deb12u2", True),
        ("257.9-1~deb13u1", True),
        ("247.3-7+deb11u4", False),
        ("x", False),
    ],
)
async def test_systemd_older_than_debian_12s_blocks(seams: Seams, version: str, ok: bool) -> None:
    seams.systemd = FakeSystemd(version)
    finding = await checks.systemd_version(seams)
    assert finding.ok is ok
    if not ok:
        _failed(finding, version, "252")


def test_the_controllers_needed_are_those_of_the_limits_boxd_sets_on_tasks() -> None:
    assert needed_controllers() == {"memory", "pids", "cpu"}


async def test_a_hybrid_machine_has_cgroup_v2_but_not_its_controllers(seams: Seams) -> None:
    (seams.cgroup / "cgroup.controllers").unlink()
    (seams.cgroup / "unified").mkdir()
    (seams.cgroup / "unified" / "cgroup.controllers").write_text("\n")
    assert (await checks.cgroup_v2(seams)).ok
    controllers = await checks.cgroup_controllers(seams)
    _failed(controllers, "cpu, memory, pids", "not enforced")
    assert not controllers.blocks


async def test_no_cgroup_v2_at_all_blocks(seams: Seams) -> None:
    (seams.cgroup / "cgroup.controllers").unlink()
    finding = await checks.cgroup_v2(seams)
    _failed(finding, "no cgroup v2", "unified_cgroup_hierarchy")
    assert finding.blocks


async def test_overlayfs_is_tried_with_the_deepest_stack_a_view_has(seams: Seams) -> None:
    run = FakeRun()
    seams.run = run
    assert (await checks.overlayfs(seams)).ok
    (mount, cwd, _), (umount, _, _) = run.asked
    assert mount[:4] == ("mount", "-t", "overlay", "overlay")
    lowers = mount[5].split("lowerdir=")[1].split(",")[0].split(":")
    assert len(lowers) == MAX_DONE + 1 == 500
    assert cwd is not None and cwd.name == "layers"
    assert umount == ("umount", mount[-1])
    # Nothing of the trial is left in BOX_HOME.
    assert list(seams.home.iterdir()) == []


async def test_an_overlay_that_does_not_mount_blocks_in_the_kernels_words(seams: Seams) -> None:
    seams.run = FakeRun(
        lambda argv, given: _ran(argv, 32, stderr=b"mount: wrong fs type, bad option")
    )
    finding = await checks.overlayfs(seams)
    _failed(finding, "wrong fs type", "500 layers")
    assert list(seams.home.iterdir()) == []


async def test_overlay_without_box_home_says_so(seams: Seams) -> None:
    seams.home = seams.home / "missing"
    _failed(await checks.overlayfs(seams), "BOX_HOME", "missing")


async def test_a_full_box_home_is_advice_not_a_block(
    seams: Seams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk (its blocks or its inodes, as a task can fill them) weakens no sandbox, and
    boxd already refuses starts on it in words: blocking would outlast it."""
    made = Path.mkdir

    def full(path: Path, *args: Any, **kwargs: Any) -> None:
        if seams.home in path.parents:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        made(path, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", full)
    finding = await checks.overlayfs(seams)
    _failed(finding, "is full", "free space")
    assert not finding.blocks


async def test_a_network_namespace_is_made_with_loopback_up_and_removed(seams: Seams) -> None:
    run = FakeRun()
    seams.run = run
    assert (await checks.network_namespaces(seams)).ok
    assert [argv for argv, _, _ in run.asked] == [
        ("ip", "netns", "add", "boxd-doctor-abcd1234"),
        ("ip", "-n", "boxd-doctor-abcd1234", "link", "set", "lo", "up"),
        ("ip", "netns", "delete", "boxd-doctor-abcd1234"),
    ]


async def test_without_ip_the_fix_is_to_install_iproute2(seams: Seams) -> None:
    def missing(argv: tuple[str, ...], given: bytes | None) -> Ran:
        raise NotInstalled(f"the command {argv[0]} is not installed")

    seams.run = FakeRun(missing)
    _failed(await checks.network_namespaces(seams), "ip is not installed", "apt install iproute2")


async def test_a_namespace_refused_blocks_in_the_kernels_words(seams: Seams) -> None:
    seams.run = FakeRun(
        lambda argv, given: _ran(argv, 1, stderr=b"mount --make-shared /run/netns failed")
    )
    finding = await checks.network_namespaces(seams)
    _failed(finding, "make-shared", "CAP_NET_ADMIN")
    assert finding.blocks


@pytest.mark.parametrize(
    ("status", "ok", "words"),
    [
        (_exited(bpf_probe.REFUSED), True, ""),
        (_exited(bpf_probe.REACHED), False, "does not enforce IPAddressDeny="),
        (_exited(4), False, "is unknown"),
        (_exited(1), False, "is unknown"),
        (_exited(9, CLD_KILLED), False, "is unknown"),
    ],
)
async def test_only_a_send_refused_says_ipaddressdeny_is_enforced(
    seams: Seams, status: UnitStatus, ok: bool, words: str
) -> None:
    seams.systemd = FakeSystemd(probe=status)
    finding = await checks.ip_address_deny(seams)
    assert finding.ok is ok
    if not ok:
        _failed(finding, words, "--system-call-filter=bpf")


async def test_the_probe_is_denied_every_address_in_a_network_of_its_own(seams: Seams) -> None:
    systemd = FakeSystemd()
    seams.systemd = systemd
    await checks.ip_address_deny(seams)
    ((name, properties),) = systemd.ran
    assert name == "boxd-doctor-bpf-abcd1234.service"
    given: dict[str, Any] = {key: value.value for key, value in properties}
    assert given["PrivateNetwork"] is True
    assert [family for family, _, prefix in given["IPAddressDeny"] if prefix == 0] == [2, 10]


async def test_the_probe_has_a_uid_of_its_own_and_an_end(seams: Seams) -> None:
    """Not nobody: any process of nobody's (an NFS-squashed file's owner, a daemon) could stop
    the probe (SIGSTOP), which would hold the checks, and with them every task's start, for
    ever; or ptrace it into exiting 0, 'enforced'. A oneshot waits for its process without end
    unless told: a probe that hangs for any reason fails the check in bounded time."""
    systemd = FakeSystemd()
    seams.systemd = systemd
    await checks.ip_address_deny(seams)
    ((_, properties),) = systemd.ran
    given: dict[str, Any] = {key: value.value for key, value in properties}
    assert given["DynamicUser"] is True and given["User"] != "nobody"
    assert 0 < given["TimeoutStartUSec"] <= 60 * 1_000_000


async def test_a_probe_systemd_would_not_run_blocks(seams: Seams) -> None:
    class Refusing(FakeSystemd):
        async def run_to_end(self, name: str, properties: list[tuple[str, Variant]]) -> UnitStatus:
            raise BoxError(Problem.FAILED, "systemd refused StartTransientUnit: Access denied")

    seams.systemd = Refusing()
    _failed(await checks.ip_address_deny(seams), "Access denied", "journalctl -u")


def _sealing(decrypted: bytes, decrypt_status: int = 0) -> Answer:
    def answer(argv: tuple[str, ...], given: bytes | None) -> Ran:
        if argv[1] == "encrypt":
            return _ran(argv, stdout=b"SEALED" + (given or b""))
        assert given is not None and given.startswith(b"SEALED")
        said = b"Failed to decrypt: Bad message" if decrypt_status else b""
        return _ran(argv, decrypt_status, stdout=decrypted, stderr=said)

    return answer


async def test_credentials_are_tried_as_the_vault_seals_them_the_value_on_stdin(
    seams: Seams,
) -> None:
    run = FakeRun(_sealing(b"boxd doctor"))
    seams.run = run
    assert (await checks.credentials(seams)).ok
    (encrypt, _, given), (decrypt, _, _) = run.asked
    assert encrypt[:3] == ("systemd-creds", "encrypt", "--with-key=host")
    assert given == b"boxd doctor" and all(arg.encode() != b"boxd doctor" for arg in encrypt)
    assert decrypt[:2] == ("systemd-creds", "decrypt")


async def test_a_host_key_that_does_not_decrypt_blocks(seams: Seams) -> None:
    seams.run = FakeRun(_sealing(b"", decrypt_status=1))
    finding = await checks.credentials(seams)
    _failed(finding, "Bad message", "credential.secret")
    assert finding.blocks


async def test_credentials_that_come_back_different_block(seams: Seams) -> None:
    seams.run = FakeRun(_sealing(b"something else"))
    _failed(await checks.credentials(seams), "not what it encrypted")


async def test_polkit_without_boxds_action_advises(seams: Seams) -> None:
    async def others() -> list[str]:
        return ["org.freedesktop.login1.reboot"]

    seams.polkit_actions = others
    finding = await checks.polkit(seams)
    _failed(finding, MANAGE_ACTION, "reinstall boxd")
    assert not finding.blocks


async def test_polkit_not_answering_advises_installing_it(seams: Seams) -> None:
    async def silent() -> list[str]:
        raise BoxError(Problem.UNAVAILABLE, "polkit does not answer on the system bus (gone)")

    seams.polkit_actions = silent
    _failed(await checks.polkit(seams), "does not answer", "apt install polkitd")


async def test_no_dbus_policy_in_any_of_the_buses_folders_advises(seams: Seams) -> None:
    seams.dbus_policy_dirs = (seams.home / "a", seams.home / "b")
    _failed(await checks.dbus_policy(seams), "org.boxd.Box1.conf", "reload dbus")


async def test_little_room_under_box_home_advises_with_how_much(seams: Seams) -> None:
    seams.free_bytes = lambda path: 100 * 2**20
    finding = await checks.disk_space(seams)
    _failed(finding, "only 100 MiB", "1 GiB")
    assert not finding.blocks


async def test_a_droid_binary_not_there_or_not_executable_advises(seams: Seams) -> None:
    os.chmod(seams.droid, stat.S_IRUSR)
    finding = await checks.droid(seams)
    _failed(finding, "not installed", "boxctl droid")
    assert not finding.blocks


async def test_a_check_that_breaks_blocks_in_its_own_words(
    seams: Seams, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(seams: Seams) -> Finding:
        raise RuntimeError("the bus went away")

    monkeypatch.setattr(checks, "CHECKS", (Check(broken, "broken", False, ""), checks.CHECKS[-1]))
    first, droid = await run_checks(seams)
    assert (first.ok, first.blocks) == (False, True)
    assert "the bus went away" in first.problem
    assert first.name == "broken" and droid.ok


async def test_each_check_answers_in_its_name_and_blocks_as_its_entry_says(seams: Seams) -> None:
    # What a check that did not answer is called, and whether it blocks, is its entry's.
    findings = await run_checks(seams)
    assert [(f.name, f.blocks) for f in findings] == [(c.name, c.blocks) for c in checks.CHECKS]


class Hanging(FakeRun):
    """Runs `command` without end (a mount on a file system that does not answer) until
    stopped, and keeps what it stopped."""

    def __init__(self, command: str) -> None:
        super().__init__(_works)
        self.command = command
        self.stopped: list[tuple[str, ...]] = []
        self.was_stopped = asyncio.Event()

    async def __call__(self, *argv: str, **given: Any) -> Ran:
        if argv[0] != self.command:
            return await super().__call__(*argv, **given)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            # Where run() kills the command (tests/manager/test_run.py).
            self.stopped.append(argv)
            self.was_stopped.set()
            raise
        raise AssertionError(f"{argv} never ends")


async def test_a_check_that_never_answers_blocks_in_time_saying_which_and_where_to_look(
    seams: Seams, monkeypatch: pytest.MonkeyPatch
) -> None:
    hanging = Hanging("mount")
    seams.run = hanging
    # A stack of three layers is made long before its time is up, and the mount begun.
    monkeypatch.setattr(checks, "MAX_DONE", 2)
    seams.check_seconds = 1
    findings = {f.name: f for f in await run_checks(seams)}
    overlay = findings["overlayfs"]
    _failed(overlay, "did not answer in 1 s", "killed what it ran", "ps -eo pid,stat,args")
    assert overlay.blocks
    await hanging.was_stopped.wait()
    assert hanging.stopped[0][:3] == ("mount", "-t", "overlay")
    # Its trial stack of layers is removed all the same, by the check stopped, which nothing
    # waits for.
    while list(seams.home.iterdir()):  # noqa: ASYNC110
        await asyncio.sleep(0.01)


async def test_an_advising_check_that_never_answers_only_advises(seams: Seams) -> None:
    async def polkit_hangs() -> list[str]:
        await asyncio.Event().wait()
        return []

    seams.polkit_actions = polkit_hangs
    seams.check_seconds = 0.05
    findings = {f.name: f for f in await run_checks(seams)}
    _failed(findings["polkit"], "did not answer in 0.05 s", "systemctl status polkit")
    assert not findings["polkit"].blocks


async def test_clearing_what_earlier_runs_left_that_hangs_does_not_hold_the_checks(
    seams: Seams,
) -> None:
    left = seams.netns_dir
    left.mkdir()
    (left / "boxd-doctor-999999999-dead").touch()
    hanging = Hanging("ip")
    seams.run = hanging
    seams.check_seconds = 0.05
    findings = {f.name: f for f in await run_checks(seams)}
    assert hanging.stopped[0] == ("ip", "netns", "delete", "boxd-doctor-999999999-dead")
    _failed(findings["network namespaces"], "did not answer in 0.05 s")


class HangingLoopback(Hanging):
    """Hangs on `ip -n NAME link set lo up` alone, once the namespace is made."""

    def __init__(self) -> None:
        super().__init__("ip")
        self.hung = asyncio.Event()

    async def __call__(self, *argv: str, **given: Any) -> Ran:
        if argv[:2] != ("ip", "-n"):
            return await FakeRun.__call__(self, *argv, **given)
        self.hung.set()
        return await super().__call__(*argv, **given)


async def test_a_namespace_check_stopped_for_its_time_removes_its_namespace(
    seams: Seams,
) -> None:
    """The clearing of what runs cut off left takes only trials of a manager gone (their pid):
    a check stopped for its time in this one must remove its own namespace, or one stays for
    each run while `ip` hangs, until boxd restarts."""
    hanging = HangingLoopback()
    seams.run = hanging
    check = asyncio.ensure_future(checks.network_namespaces(seams))
    await hanging.hung.wait()
    check.cancel()
    with pytest.raises(asyncio.CancelledError):
        await check
    asked = [argv for argv, _, _ in hanging.asked]
    made = next(argv for argv in asked if argv[:3] == ("ip", "netns", "add"))
    assert asked[-1] == ("ip", "netns", "delete", made[3]), asked
