"""Each task's disk quota (boxd/manager/units/disk_quota.py), with the kernel's two interfaces stood
in for: what is sent to FS_IOC_FSSETXATTR and quotactl_fd, and what boxd makes of their answers.
(The test machine's kernel has no quota format built in: tests/vm cannot mount a file system
that keeps them, see tests/vm/test_disk_full.py.)"""

import ctypes
import errno
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from boxd.errors import BoxError
from boxd.manager.units import disk_quota
from boxd.wire.models.settings import MIB, Settings, change_settings


class FakeKernel:
    def __init__(self, flags: int = 0, fails: int | None = None) -> None:
        self.flags = flags
        self.fails = fails
        self.ioctls: list[tuple[int, bytes]] = []
        self.quotactls: list[tuple[int, int, bytes]] = []
        self.xattr = struct.pack("=5I8x", 0x8, 4096, 3, 0, 0)

    def ioctl(self, fd: int, request: int, argument: Any) -> Any:
        assert os.fstat(fd)  # an open fd, not a path
        if request == disk_quota.FS_IOC_FSGETXATTR:
            argument[:] = self.xattr
            return 0
        self.ioctls.append((request, bytes(argument)))
        return 0

    def quotactl(self, fd: int, command: int, ident: int, buffer: Any) -> None:
        assert os.fstat(fd)
        if self.fails is not None:
            raise OSError(self.fails, os.strerror(self.fails))
        self.quotactls.append((command, ident, bytes(buffer.raw)))
        if command == disk_quota.Q_XGETQSTATV:
            assert buffer.raw[0] == disk_quota.FS_QSTATV_VERSION1
            ctypes.memmove(buffer, struct.pack("=bBH", 1, 0, self.flags), 4)


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    fake = FakeKernel()
    monkeypatch.setattr("boxd.manager.units.disk_quota.fcntl.ioctl", fake.ioctl)
    monkeypatch.setattr(disk_quota, "_quotactl", fake.quotactl)
    return fake


def test_a_folder_joins_the_project_and_passes_it_on_keeping_its_other_flags(
    tmp_path: Path, kernel: FakeKernel
) -> None:
    (tmp_path / "home").mkdir()
    disk_quota.set_project_of(tmp_path, "home", 1_879_048_193)
    [(request, sent)] = kernel.ioctls
    assert request == disk_quota.FS_IOC_FSSETXATTR
    assert struct.unpack("=5I8x", sent) == (0x8 | 0x200, 4096, 3, 1_879_048_193, 0)


def test_a_link_in_place_of_the_folder_is_not_followed(tmp_path: Path, kernel: FakeKernel) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "home").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError) as raised:
        disk_quota.set_project_of(tmp_path, "home", 1_879_048_193)
    assert raised.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert kernel.ioctls == []


def test_the_limit_is_set_in_kibibytes_for_the_project(tmp_path: Path, kernel: FakeKernel) -> None:
    disk_quota.limit(tmp_path, 1_879_048_193, 64 * MIB + 1)
    [(command, ident, sent)] = kernel.quotactls
    assert command == 0x800008 and ident == 1_879_048_193
    hard, soft, *_, valid = struct.unpack("=8QI4x", sent)
    assert (hard, soft, valid) == (64 * 1024 + 1, 0, disk_quota.QIF_BLIMITS)


def test_the_file_system_must_enforce_project_quotas(tmp_path: Path, kernel: FakeKernel) -> None:
    kernel.flags = disk_quota.FS_QUOTA_PDQ_ENFD | 0x10
    assert disk_quota.why_not(tmp_path) is None
    # Counted but not enforced (XFS's pqnoenforce), or only users' quotas.
    for flags in (0x10, 0x1 | 0x2):
        kernel.flags = flags
        assert disk_quota.why_not(tmp_path) == (
            f"the file system of {tmp_path} does not enforce project quotas"
        )
    # ext4 without quotas has no answer (ENOSYS, as a kernel before quotactl_fd).
    for fails in (errno.ENOSYS, errno.ESRCH):
        kernel.fails = fails
        assert disk_quota.why_not(tmp_path) == (
            f"the file system of {tmp_path} does not enforce project quotas"
        )
    kernel.fails = errno.EPERM
    assert disk_quota.why_not(tmp_path) == (
        f"boxd could not ask the file system of {tmp_path} which quotas it keeps (Operation not "
        "permitted)"
    )


def test_the_setting_is_off_by_default_and_a_whole_number_of_bytes() -> None:
    assert Settings().taskDiskQuotaBytes is None
    assert change_settings(Settings(), {"taskDiskQuotaBytes": 64 * MIB}).taskDiskQuotaBytes == (
        64 * MIB
    )
    assert (
        change_settings(
            Settings(taskDiskQuotaBytes=64 * MIB), {"taskDiskQuotaBytes": None}
        ).taskDiskQuotaBytes
        is None
    )
    for wrong in (64 * MIB - 1, 2**50 + 1, 1.5e8, "100M", True):
        with pytest.raises(BoxError) as refused:
            change_settings(Settings(), {"taskDiskQuotaBytes": wrong})
        assert refused.value.message == (
            "taskDiskQuotaBytes must be null (no quota) or a whole number of bytes from "
            "67108864 to 1125899906842624"
        )
