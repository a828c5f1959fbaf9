"""A spare's worker started ahead (boxd/workers/ahead.py) and the manager's check before waking
it (boxd/manager/units/worker_ahead.py): read from a real process's /proc where that needs no root,
and from written /proc files for what it cannot show here (a view mounted)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from boxd.manager.units.worker_ahead import caught_signals, not_ready, top_mount
from boxd.wire.worker_kinds import WAKES, WORKERS
from boxd.workers.ahead import NOT_MOUNTED

VIEW = Path("/var/lib/boxd/tasks/t000000001/work")

# Lines of a mountinfo as a worker sees it: the view's mount point bound in (BindPaths=), then
# the task's view mounted on it from outside and propagated in.
BOUND = f"610 590 254:1 /var/lib/boxd/tasks/t000000001/work {VIEW} rw,nosuid - ext4 /dev/vda1 rw"
OVERLAY = f"655 610 0:77 / {VIEW} rw,relatime shared:5 - overlay overlay rw,lowerdir=a"


def _status(mask: int) -> str:
    return f"Name:\tpython3\nSigBlk:\t0000000000000000\nSigCgt:\t{mask:016x}\nUid:\t1\n"


def _bits(*numbers: int) -> int:
    return sum(1 << (number - 1) for number in numbers)


def test_the_signals_caught_are_read_from_sigcgt() -> None:
    assert caught_signals(_status(_bits(2, 10, 12, 17))) == {2, 10, 12, 17}
    assert caught_signals(_status(0)) == set()
    assert caught_signals("Name:\tx\n") == set()


def test_the_mount_seen_on_a_path_is_the_last_one_made_there() -> None:
    assert top_mount(f"{BOUND}\n{OVERLAY}\n", VIEW) == "overlay"
    assert top_mount(f"{BOUND}\n", VIEW) == "ext4"
    assert top_mount(f"{OVERLAY}\n", VIEW.parent) is None
    # A longer path that starts with the view's is not the view.
    other = OVERLAY.replace(f" {VIEW} ", f" {VIEW}2 ")
    assert top_mount(f"{BOUND}\n{other}\n", VIEW) == "ext4"


def test_a_mount_point_with_a_space_is_read_through_its_escape() -> None:
    spaced = Path("/srv/box home/tasks/t1/work")
    line = OVERLAY.replace(f" {VIEW} ", " /srv/box\\040home/tasks/t1/work ")
    assert top_mount(line, spaced) == "overlay"


def _proc(tmp_path: Path, status: str, mountinfo: str) -> Path:
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "status").write_text(status)
    (tmp_path / "77" / "mountinfo").write_text(mountinfo)
    return tmp_path


def test_a_worker_that_catches_its_signals_and_sees_its_view_is_ready(tmp_path: Path) -> None:
    proc = _proc(tmp_path, _status(_bits(*WAKES)), f"{BOUND}\n{OVERLAY}\n")
    assert not_ready(77, VIEW, WAKES, proc) is None


def test_a_worker_that_does_not_catch_a_signal_yet_is_not_ready(tmp_path: Path) -> None:
    # Sent now, that signal would kill it, with the task's start.
    proc = _proc(tmp_path, _status(_bits(signal.SIGUSR1)), f"{BOUND}\n{OVERLAY}\n")
    assert not_ready(77, VIEW, WAKES, proc) == "it does not yet catch SIGUSR2"


def test_a_worker_that_does_not_see_the_view_is_not_ready(tmp_path: Path) -> None:
    # Woken, it would refuse to run: its task's view did not reach its mount namespace.
    proc = _proc(tmp_path, _status(_bits(*WAKES)), f"{BOUND}\n")
    assert not_ready(77, VIEW, WAKES, proc) == f"it does not see the task's view on {VIEW}"


def test_a_worker_whose_process_is_gone_is_not_ready(tmp_path: Path) -> None:
    why = not_ready(77, VIEW, WAKES, tmp_path)
    assert why is not None and why.startswith("its process 77 cannot be read")


def test_each_worker_has_its_own_wake_signal() -> None:
    assert len(WAKES) == len(WORKERS)
    assert signal.SIGKILL not in WAKES and signal.SIGTERM not in WAKES


def _start_ahead(cwd: Path) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        [sys.executable, "-I", "-u", "-m", "boxd.workers.ahead"],
        cwd=cwd,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(Path.cwd())},
        stderr=subprocess.PIPE,
        text=True,
    )


def _until_ready(pid: int) -> None:
    deadline = time.monotonic() + 30
    while not caught_signals(Path(f"/proc/{pid}/status").read_text()) >= WAKES:
        assert time.monotonic() < deadline, "the worker started ahead never caught its signals"
        time.sleep(0.01)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
def test_a_worker_started_ahead_waits_and_refuses_to_run_without_its_view(
    tmp_path: Path,
) -> None:
    worker = _start_ahead(tmp_path)
    try:
        _until_ready(worker.pid)
        # Ready for its signal, with nothing mounted on its working directory: the manager
        # would not wake it.
        assert not_ready(worker.pid, tmp_path, WAKES) == (
            f"it does not see the task's view on {tmp_path}"
        )
        status = Path(f"/proc/{worker.pid}/status").read_text()
        assert worker.poll() is None
        # It waits with its signals unblocked: a blocked one is not seen as caught by anyone.
        blocked = next(line for line in status.splitlines() if line.startswith("SigBlk:"))
        assert int(blocked.split()[1], 16) & _bits(*WAKES) == 0
        # Woken all the same, it refuses rather than run the task on an empty directory.
        os.kill(worker.pid, signal.SIGUSR1)
        _, errors = worker.communicate(timeout=30)
        assert worker.returncode == 1
        assert NOT_MOUNTED in errors
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
def test_a_signal_that_wakes_no_worker_kills_nothing_and_is_not_a_wake(tmp_path: Path) -> None:
    worker = _start_ahead(tmp_path)
    try:
        _until_ready(worker.pid)
        # SIGCHLD is ignored; the worker goes on waiting for one of its own.
        os.kill(worker.pid, signal.SIGCHLD)
        time.sleep(0.2)
        assert worker.poll() is None
    finally:
        worker.kill()
        worker.wait()


def test_a_view_reached_through_a_link_is_found_where_the_kernel_mounted_it(
    tmp_path: Path,
) -> None:
    # A BOX_HOME given through a link: mountinfo has the path the kernel mounted on, no link.
    real = tmp_path / "real"
    (real / "work").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    mounted = OVERLAY.replace(f" {VIEW} ", f" {os.path.realpath(real / 'work')} ")
    proc = tmp_path / "proc"
    proc.mkdir()
    _proc(proc, _status(_bits(*WAKES)), f"{mounted}\n")
    assert not_ready(77, tmp_path / "link" / "work", WAKES, proc) is None
