"""`boxd claude-install`: the agents' installer with Claude Code's pin: its package's address,
its binary's member, its integrity, its words."""

import base64
import hashlib
import io
import os
import tarfile
from pathlib import Path
from typing import IO

import pytest

from boxd.agents.installer import InstallError, install
from boxd.claude.installer import CLAUDE, failure_reason
from boxd.claude.release import CLAUDE_DIR, VERSION, claude_binary

BINARY = b"\x7fELF claude, as if " * 1000


def integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def package(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


GOOD = package({"package/package.json": b"{}", "package/claude": BINARY})


class Registry:
    def __init__(self, body: bytes) -> None:
        self.body = body
        self.asked: list[str] = []

    def __call__(self, url: str) -> IO[bytes]:
        self.asked.append(url)
        return io.BytesIO(self.body)


def test_the_pin_is_the_published_platform_package() -> None:
    assert CLAUDE.tarball_url("https://registry.npmjs.org/") == (
        "https://registry.npmjs.org/@anthropic-ai/claude-code-linux-x64/-/"
        "claude-code-linux-x64-2.1.337.tgz"
    )
    assert CLAUDE.installed() == claude_binary() == CLAUDE_DIR / VERSION / "claude"
    # What `npm view @anthropic-ai/claude-code-linux-x64@2.1.337 dist.integrity` says.
    assert CLAUDE.integrity == (
        "sha512-Wce/AADPVSsX4txVsbtajQ8dHgqUZo5JP6DskT91BUHEMsnzlO4oodZMXpc8skllMfIdj6s3sd6Cl"
        "GQ6ebnOAg=="
    )


def test_installs_the_binary_alone(tmp_path: Path) -> None:
    registry = Registry(GOOD)
    assert install(CLAUDE, tmp_path, "https://registry.example", registry, integrity(GOOD))
    assert registry.asked == [CLAUDE.tarball_url("https://registry.example")]
    assert (tmp_path / VERSION / "claude").read_bytes() == BINARY
    assert os.listdir(tmp_path / VERSION) == ["claude"]
    assert os.stat(tmp_path / VERSION / "claude").st_mode & 0o777 == 0o755


def test_droid_s_package_is_not_claude_code(tmp_path: Path) -> None:
    droid = package({"package/bin/droid": BINARY})
    with pytest.raises(InstallError, match="holds no package/claude"):
        install(CLAUDE, tmp_path, "https://registry.example", Registry(droid), integrity(droid))
    with pytest.raises(InstallError, match=r"did not serve Claude Code 2\.1\.337 as published"):
        install(CLAUDE, tmp_path, "https://registry.example", Registry(GOOD))
    assert not (tmp_path / VERSION / "claude").exists()


def test_the_reason_survives_the_journal_line() -> None:
    said = "https://r.example answered 404 Not Found"
    line = f"Claude Code {VERSION} could not be installed: {said}."
    assert failure_reason(line) == said
    assert failure_reason(f"Droid 0.225.2 could not be installed: {line}") is None
