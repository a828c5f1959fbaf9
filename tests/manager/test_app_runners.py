"""The manager's side of the apps' runners (boxd/manager/app_runners.py): which apps are
installed, read without their code; each one's user, vault directory and socket; the socket of
an app gone is stopped; a runner whose app's secret changed is stopped, to start anew."""

import os
import stat
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, cast

import pytest

from boxd.apps.entry_points import EntryPoint
from boxd.manager import app_runners
from boxd.manager.access.vault import Vault
from boxd.manager.app_runners import AppRunners
from boxd.manager.units.systemd import Systemd


class FakeSystemd:
    def __init__(self, loaded: list[str]) -> None:
        self.loaded = loaded
        self.said: list[str] = []

    async def start_unit(self, name: str) -> None:
        self.said.append(f"start {name}")

    async def stop_unit(self, name: str) -> None:
        self.said.append(f"stop {name}")

    async def loaded_units(self, pattern: str) -> list[str]:
        return [unit for unit in self.loaded if fnmatch(unit, pattern)]


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    users: list[str] = []

    async def ensure_system_user(name: str, comment: str) -> None:
        users.append(f"{name} ({comment})")

    def installed() -> dict[str, EntryPoint]:
        return {name: EntryPoint(name, f"{name}_app:app") for name in ("wallet", "echo")}

    monkeypatch.setattr(app_runners, "ensure_system_user", ensure_system_user)
    monkeypatch.setattr(app_runners, "installed", installed)
    # The users made are this test's own.
    monkeypatch.setattr(app_runners, "user_ids", lambda name: (os.getuid(), os.getgid()))
    return users


async def test_each_installed_app_gets_its_user_vault_and_socket(
    tmp_path: Path, made: list[str]
) -> None:
    home = tmp_path / "home"
    vault = Vault(home)
    vault.open()
    systemd = FakeSystemd(["box-app@echo.socket", "box-app@gone.socket"])
    runners = AppRunners(cast(Systemd, systemd), vault, home)
    await runners.open()
    assert made == ["boxd-app-echo (boxd app echo)", "boxd-app-wallet (boxd app wallet)"]
    assert runners.installed == {"echo", "wallet"}
    assert sorted(p.name for p in (home / "vault" / "apps").iterdir()) == ["echo", "wallet"]
    assert systemd.said == [
        "stop box-app@gone.socket",
        "stop box-app@gone.service",
        "start box-app@echo.socket",
        "start box-app@wallet.socket",
    ]
    assert stat.S_IMODE((home / "apps").stat().st_mode) == 0o700
    # Each app's state directory is made before its runner ever starts: systemd would make it
    # then, and on a full disk could not.
    assert sorted(p.name for p in (home / "apps").iterdir()) == ["echo", "wallet"]
    assert stat.S_IMODE((home / "apps" / "echo").stat().st_mode) == 0o700


async def test_a_state_directory_there_already_is_left_to_systemd(
    tmp_path: Path, made: list[str]
) -> None:
    kept = tmp_path / "apps" / "wallet"
    kept.mkdir(parents=True, mode=0o755)
    (kept / "ledger.db").write_text("the old broker's")
    vault = Vault(tmp_path)
    vault.open()
    await AppRunners(cast(Systemd, FakeSystemd([])), vault, tmp_path).open()
    assert (kept / "ledger.db").read_text() == "the old broker's"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o755


async def test_brokers_of_before_the_upgrade_are_stopped_before_their_state_moves(
    tmp_path: Path, made: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "apps").mkdir()
    vault = Vault(tmp_path)
    vault.open()
    systemd = FakeSystemd(["box-broker@t000000001.service", "box-broker@t000000001.socket"])
    runners = AppRunners(cast(Systemd, systemd), vault, tmp_path)
    # BOX_HOME/apps as the brokers left it: theirs, not the manager's.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "geteuid", lambda: os.getuid() + 1)
        assert runners._brokers_kept_state()
    monkeypatch.setattr(runners, "_brokers_kept_state", lambda: True)
    monkeypatch.setattr(runners, "_make_state_directory", lambda: systemd.said.append("chown"))
    await runners.open()
    assert systemd.said[:2] == ["stop box-broker@t000000001.service", "chown"]
    # Once the manager's, nothing is stopped.
    assert not AppRunners(cast(Systemd, systemd), vault, tmp_path)._brokers_kept_state()


async def test_a_runner_is_stopped_when_its_apps_secret_changes(
    tmp_path: Path, made: list[str]
) -> None:
    vault = Vault(tmp_path)
    vault.open()
    systemd = FakeSystemd([])
    runners = AppRunners(cast(Systemd, systemd), vault, tmp_path)
    await runners.open()
    systemd.said.clear()
    for owner in ("wallet", "box", "mail"):
        await runners.secrets_changed(owner)
    # The box's secrets are the brokers' (and their spares are judged by Vault.changes); mail
    # is not installed here.
    assert systemd.said == ["stop box-app@wallet.service"]


def test_an_apps_name_is_one_its_units_and_user_can_take() -> None:
    from boxd.wire.secret_names import belongs_to, is_app_name

    assert all(is_app_name(name) for name in ("mail", "my-app", "a" * 23, "x9"))
    assert not any(is_app_name(n) for n in ("box", "Mail", "a" * 24, "9x", "a_b", "a.b", ""))
    assert len(app_runners.app_user("a" * 23)) == 32
    owners: dict[str, Any] = {
        "mail.password": "mail",
        "ANTHROPIC_API_KEY": "box",
        "FACTORY_API_KEY": "box",
        "box.key": None,
        "GITHUB_TOKEN": None,
        "mail.": None,
    }
    assert {name: belongs_to(name) for name in owners} == owners
