"""The agents' installer, with Droid's pin: only the published bytes, only the binary, never half
of it in place."""

import base64
import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path
from typing import IO

import pytest

from boxd.agents import installer as agents_installer
from boxd.agents.installer import InstallError, install
from boxd.droid.installer import DROID
from boxd.droid.release import BINARY_IN_PACKAGE, VERSION

BINARY = b"\x7fELF droid, as if " * 1000
REGISTRY = "https://registry.example"


def integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def package(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def regular(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o755
    return info, data


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


GOOD = package(
    regular("package/package.json", b"{}"),
    regular(BINARY_IN_PACKAGE, BINARY),
    regular("package/README.md", b"# droid"),
)


class Registry:
    """Serves one body for the pinned tarball's address and counts the downloads."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.asked: list[str] = []

    def __call__(self, url: str) -> IO[bytes]:
        self.asked.append(url)
        return io.BytesIO(self.body)


def binary(droid_dir: Path) -> Path:
    return droid_dir / VERSION / "droid"


def leftovers(droid_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(droid_dir)) for p in droid_dir.rglob(".*"))


def test_installs_the_binary_alone_runnable_by_all(tmp_path: Path) -> None:
    registry = Registry(GOOD)
    assert install(DROID, tmp_path, REGISTRY, registry, integrity(GOOD)) is True
    assert registry.asked == [DROID.tarball_url(REGISTRY)]
    assert binary(tmp_path).read_bytes() == BINARY
    assert binary(tmp_path).stat().st_mode & 0o7777 == 0o755
    assert os.listdir(tmp_path / VERSION) == ["droid"]
    assert leftovers(tmp_path) == []


def test_already_installed_downloads_nothing(tmp_path: Path) -> None:
    binary(tmp_path).parent.mkdir(parents=True)
    binary(tmp_path).write_bytes(b"the installed one")
    registry = Registry(GOOD)
    assert install(DROID, tmp_path, REGISTRY, registry, integrity(GOOD)) is False
    assert registry.asked == []
    assert binary(tmp_path).read_bytes() == b"the installed one"


def test_other_bytes_than_published_are_refused_before_unpacking(tmp_path: Path) -> None:
    # A well-formed package holding another binary: only the integrity tells it apart.
    other = package(regular(BINARY_IN_PACKAGE, b"#!/bin/sh\necho owned\n"))
    with pytest.raises(InstallError, match=r"did not serve Droid .* as published"):
        install(DROID, tmp_path, REGISTRY, Registry(other), integrity(GOOD))
    assert not binary(tmp_path).exists()
    assert leftovers(tmp_path) == []


def test_the_pinned_integrity_is_the_default(tmp_path: Path) -> None:
    with pytest.raises(InstallError, match="its sha512 differs"):
        install(DROID, tmp_path, REGISTRY, Registry(GOOD))
    assert not binary(tmp_path).exists()


@pytest.mark.parametrize(
    "members, words",
    [
        ((link(BINARY_IN_PACKAGE, "/bin/sh"),), "not a regular file"),
        ((link(BINARY_IN_PACKAGE, "package/README.md", tarfile.LNKTYPE),), "not a regular file"),
        (
            (regular(BINARY_IN_PACKAGE, BINARY), regular(BINARY_IN_PACKAGE, b"second")),
            "more than once",
        ),
        ((regular("package/bin/droid.real", BINARY),), "holds no package/bin/droid"),
    ],
)
def test_links_doubles_and_missing_binaries_are_refused(
    tmp_path: Path, members: tuple[tuple[tarfile.TarInfo, bytes | None], ...], words: str
) -> None:
    body = package(regular("package/README.md", b"x"), *members)
    with pytest.raises(InstallError, match=words):
        install(DROID, tmp_path, REGISTRY, Registry(body), integrity(body))
    assert not binary(tmp_path).exists()
    assert leftovers(tmp_path) == []


def test_other_members_are_not_extracted(tmp_path: Path) -> None:
    body = package(
        regular("../../escaped", b"x"), regular("/etc/evil", b"x"), regular(BINARY_IN_PACKAGE, b"d")
    )
    install(DROID, tmp_path, REGISTRY, Registry(body), integrity(body))
    found = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert found == [VERSION, f"{VERSION}/droid"]
    assert not (tmp_path.parent / "escaped").exists()


def test_an_absurd_binary_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agents_installer, "MAX_BINARY_BYTES", len(BINARY) - 1)
    with pytest.raises(InstallError, match="more than the"):
        install(DROID, tmp_path, REGISTRY, Registry(GOOD), integrity(GOOD))
    assert not binary(tmp_path).exists()


def test_an_endless_download_is_cut_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agents_installer, "MAX_TARBALL_BYTES", len(GOOD) - 1)
    with pytest.raises(InstallError, match="far more than the package"):
        install(DROID, tmp_path, REGISTRY, Registry(GOOD), integrity(GOOD))
    assert leftovers(tmp_path) == []


def test_a_binary_cut_short_never_reaches_its_path(tmp_path: Path) -> None:
    # The whole gzip stream but for its last bytes: tar finds the binary's header and starts
    # writing it, then the stream ends.
    whole = gzip.decompress(GOOD)
    cut = gzip.compress(whole[: len(whole) // 2])
    with pytest.raises(InstallError, match="cannot be unpacked"):
        install(DROID, tmp_path, REGISTRY, Registry(cut), integrity(cut))
    assert not binary(tmp_path).exists()
    assert leftovers(tmp_path) == []


def test_leftovers_of_a_run_cut_short_go(tmp_path: Path) -> None:
    (tmp_path / VERSION).mkdir()
    (tmp_path / VERSION / ".droid-123").write_bytes(b"half")
    (tmp_path / ".download-abc").mkdir()
    (tmp_path / ".download-abc" / "package.tgz").write_bytes(b"half")
    install(DROID, tmp_path, REGISTRY, Registry(GOOD), integrity(GOOD))
    assert leftovers(tmp_path) == []
    assert binary(tmp_path).read_bytes() == BINARY


def test_the_registry_must_be_a_web_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOX_NPM_REGISTRY", "file:///etc")
    with pytest.raises(InstallError, match="BOX_NPM_REGISTRY must be an http"):
        agents_installer.registry()
    monkeypatch.setenv("BOX_NPM_REGISTRY", "http://127.0.0.1:4873/")
    assert agents_installer.registry() == "http://127.0.0.1:4873/"
    monkeypatch.delenv("BOX_NPM_REGISTRY")
    assert agents_installer.registry() == "https://registry.npmjs.org"


def test_a_registry_that_cannot_be_reached_says_so(tmp_path: Path) -> None:
    with pytest.raises(InstallError, match="could not be reached"):
        install(DROID, tmp_path, "http://127.0.0.1:9", integrity=integrity(GOOD))
    assert leftovers(tmp_path) == []
