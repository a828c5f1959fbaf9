"""The vault's own rules, with a stand-in for systemd-creds (the real one is in tests/vm): whose
each secret is and where it is kept for that, and how a runner hands a tool the secrets it
declared, and no others."""

import base64
import logging
import stat
from pathlib import Path

import pytest

from boxd.errors import BoxError, Problem
from boxd.manager.access.vault import MAX_VALUE, Vault, check_name
from boxd.wire.caller import Caller, Role
from boxd.wire.credentials import read_secrets
from boxd.wire.secret_names import CREDENTIAL_ID, credential_name

REPO = Path(__file__).resolve().parents[3]
OWNER = Caller(Role.OWNER, "ann")
VALUE = "correct horse battery staple"

# Like systemd-creds: the embedded name and the value in one blob, base64. It also notes its
# arguments, so a test can tell the value never was one.
FAKE_ENCRYPT = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/argv"
for argument; do case "$argument" in --name=*) name=${argument#--name=};; esac; done
{ printf '%s\\n' "$name"; cat; } | base64
"""
# A systemd-creds that fails, after its usual warning.
FAILING_ENCRYPT = """#!/bin/sh
echo "Credential secret file '/x' is not located on encrypted media, using anyway." >&2
echo "Failed to write credential: No space left on device" >&2
exit 1
"""
# One that, carelessly, repeats its input in its error.
ECHOING_ENCRYPT = """#!/bin/sh
echo "cannot encrypt: $(cat)" >&2
exit 1
"""


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def vault(tmp_path: Path) -> Vault:
    (tmp_path / "bin").mkdir()
    fake = _script(tmp_path / "bin" / "creds", FAKE_ENCRYPT)
    opened = Vault(tmp_path / "home", encrypt=(str(fake),))
    opened.open()
    return opened


def files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


async def test_set_list_and_remove(vault: Vault, tmp_path: Path) -> None:
    assert await vault.set_secret(OWNER, "mail.password", VALUE) == {"name": "mail.password"}
    assert await vault.set_secret(OWNER, "a-app.token_2", "x") == {"name": "a-app.token_2"}
    assert await vault.set_secret(OWNER, "ANTHROPIC_API_KEY", "k") == {"name": "ANTHROPIC_API_KEY"}
    assert await vault.list_secrets(OWNER) == [
        {"name": "ANTHROPIC_API_KEY", "belongsTo": "box"},
        {"name": "a-app.token_2", "belongsTo": "a-app"},
        {"name": "mail.password", "belongsTo": "mail"},
    ]
    # Each owner's in a directory of its own, which one unit loads.
    assert files(vault.directory) == [
        "apps/a-app/a-app.token_2.cred",
        "apps/mail/mail.password.cred",
        "box/ANTHROPIC_API_KEY.cred",
    ]
    sealed = vault.directory / "apps/mail/mail.password.cred"
    assert base64.b64decode(sealed.read_bytes()).decode() == f"vault_mail.password.cred\n{VALUE}"
    assert stat.S_IMODE(sealed.stat().st_mode) == 0o600
    for directory in (vault.directory, sealed.parent, sealed.parent.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    argv = (tmp_path / "bin" / "argv").read_text()
    assert VALUE not in argv
    assert "--name=vault_mail.password.cred - -" in argv
    assert await vault.remove_secret(OWNER, "a-app.token_2") == {"name": "a-app.token_2"}
    assert await vault.remove_secret(OWNER, "ANTHROPIC_API_KEY") == {"name": "ANTHROPIC_API_KEY"}
    assert await vault.list_secrets(OWNER) == [{"name": "mail.password", "belongsTo": "mail"}]
    assert files(vault.directory) == ["apps/mail/mail.password.cred"]


@pytest.mark.parametrize(
    "name", ["GITHUB_TOKEN", "Mail.password", "box.key", "x.", "a" * 24 + ".b"]
)
async def test_a_secret_that_belongs_to_no_one_is_refused(vault: Vault, name: str) -> None:
    with pytest.raises(BoxError) as caught:
        await vault.set_secret(OWNER, name, VALUE)
    assert caught.value.problem == Problem.INVALID
    assert caught.value.message == (
        f"{name} belongs to no app: a secret is an app's, named <app>.<name> like mail.password "
        "(only that app's tools get it), or one of the box's model keys (ANTHROPIC_API_KEY, "
        "FACTORY_API_KEY)"
    )
    assert await vault.list_secrets(OWNER) == []


async def test_the_runner_of_the_app_whose_secret_changed_is_told(vault: Vault) -> None:
    told: list[str] = []

    async def changed(owner: str) -> None:
        told.append(owner)

    vault.changed = changed
    await vault.set_secret(OWNER, "mail.user", "box")
    await vault.set_secret(OWNER, "FACTORY_API_KEY", "k")
    await vault.remove_secret(OWNER, "mail.user")
    assert told == ["mail", "box", "mail"]


def test_open_moves_the_old_layout_to_each_owner(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before, every secret sat in vault/, and every broker loaded them all.
    old = tmp_path / "home" / "vault"
    old.mkdir(parents=True)
    for name in ("mail.password", "ANTHROPIC_API_KEY", "GITHUB_TOKEN", "wallet.key"):
        (old / f"{name}.cred").write_text(f"sealed {name}")
    vault = Vault(tmp_path / "home")
    vault.open()
    assert files(old) == [
        "GITHUB_TOKEN.cred",
        "apps/mail/mail.password.cred",
        "apps/wallet/wallet.key.cred",
        "box/ANTHROPIC_API_KEY.cred",
    ]
    # Renamed, not decrypted: the embedded name is the same in either place.
    assert (old / "apps/mail/mail.password.cred").read_text() == "sealed mail.password"
    assert vault.listing() == [
        {"name": "ANTHROPIC_API_KEY", "belongsTo": "box"},
        {"name": "GITHUB_TOKEN", "belongsTo": None},
        {"name": "mail.password", "belongsTo": "mail"},
        {"name": "wallet.key", "belongsTo": "wallet"},
    ]
    assert "GITHUB_TOKEN belongs to no app and reaches no tool" in caplog.text
    vault.open()
    assert len(files(old)) == 4


async def test_one_that_belongs_to_no_one_can_be_removed(tmp_path: Path) -> None:
    old = tmp_path / "home" / "vault"
    old.mkdir(parents=True)
    (old / "GITHUB_TOKEN.cred").write_text("sealed")
    vault = Vault(tmp_path / "home")
    vault.open()
    await vault.remove_secret(OWNER, "GITHUB_TOKEN")
    assert vault.listing() == []


def test_a_file_put_in_another_owners_place_reaches_no_one(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "home")
    vault.open()
    evil = vault.app_directory("evil")
    (evil / "mail.password.cred").write_text("sealed")
    (evil / "evil.token.cred").write_text("sealed")
    assert vault.names() == ["evil.token"]


async def test_setting_again_replaces(vault: Vault) -> None:
    await vault.set_secret(OWNER, "mail.user", "old")
    await vault.set_secret(OWNER, "mail.user", "new")
    sealed = (vault.directory / "apps/mail/mail.user.cred").read_bytes()
    assert base64.b64decode(sealed).decode().endswith("\nnew")
    assert files(vault.directory) == ["apps/mail/mail.user.cred"]


async def test_removing_what_is_not_there(vault: Vault) -> None:
    with pytest.raises(BoxError) as caught:
        await vault.remove_secret(OWNER, "nothing.here")
    assert caught.value.problem == Problem.NOT_FOUND
    assert caught.value.message == "no secret nothing.here in the vault"


@pytest.mark.parametrize(
    "name", ["", ".hidden", "-dash", "a/b", "../x", "a b", "é", "x" * 65, "a\nb"]
)
def test_names_are_checked(name: str) -> None:
    with pytest.raises(BoxError) as caught:
        check_name(name)
    assert caught.value.problem == Problem.INVALID
    assert "is not a secret name" in caught.value.message


def test_good_names() -> None:
    for name in ("a", "mail.password", "A_b-c.9", "x" * 64):
        assert check_name(name) == name


async def test_values_are_checked_without_being_repeated(vault: Vault) -> None:
    cases = [
        ("", Problem.INVALID, "the value of a.k is empty; boxctl vault rm a.k removes it"),
        ("a\0b", Problem.INVALID, "the value of a.k holds a NUL character; secrets are text"),
        (
            "v" * (MAX_VALUE + 1),
            Problem.TOO_LARGE,
            f"the value of a.k is {MAX_VALUE + 1} bytes; a secret holds at most {MAX_VALUE} bytes",
        ),
    ]
    for value, problem, message in cases:
        with pytest.raises(BoxError) as caught:
            await vault.set_secret(OWNER, "a.k", value)
        assert (caught.value.problem, caught.value.message) == (problem, message)
    assert await vault.list_secrets(OWNER) == []


async def test_each_owners_secrets_stay_within_what_systemd_loads(vault: Vault) -> None:
    # systemd 252 starts no unit whose credentials pass 1 MiB, names included: 15 secrets of
    # 64 KiB load, 16 do not (seen with LoadCredentialEncrypted= on Debian 12). A unit loads
    # one owner's secrets.
    for number in range(15):
        await vault.set_secret(OWNER, f"a.s{number}", "v" * MAX_VALUE)
    with pytest.raises(BoxError) as caught:
        await vault.set_secret(OWNER, "a.s15", "v" * MAX_VALUE)
    assert caught.value.problem == Problem.TOO_LARGE
    assert caught.value.message == (
        "app a's secrets would pass 1024 KiB in all with a.s15, more than systemd loads into "
        "one process; remove secrets you no longer need first"
    )
    await vault.set_secret(OWNER, "a.s0", "v" * MAX_VALUE)  # replacing one still fits
    await vault.set_secret(OWNER, "a.s15", "small")
    await vault.set_secret(OWNER, "b.s15", "v" * MAX_VALUE)  # another app's own


@pytest.mark.parametrize(
    ("script", "why"),
    [
        (FAILING_ENCRYPT, ": Failed to write credential: No space left on device"),
        (ECHOING_ENCRYPT, ""),
    ],
)
async def test_a_failure_says_why_without_the_value(tmp_path: Path, script: str, why: str) -> None:
    failing = _script(tmp_path / "creds", script)
    vault = Vault(tmp_path / "home", encrypt=(str(failing),))
    vault.open()
    with pytest.raises(BoxError) as caught:
        await vault.set_secret(OWNER, "mail.password", VALUE)
    assert caught.value.problem == Problem.FAILED
    assert caught.value.message == (
        f"systemd-creds could not encrypt mail.password (exit status 1){why}"
    )
    assert await vault.list_secrets(OWNER) == []


async def test_a_missing_systemd_creds(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "home", encrypt=(str(tmp_path / "no-such-program"),))
    vault.open()
    with pytest.raises(BoxError, match=r"cannot keep a.k: .*no-such-program is not installed"):
        await vault.set_secret(OWNER, "a.k", VALUE)


async def test_the_journal_names_secrets_and_never_their_values(
    vault: Vault, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="boxd.manager.access.vault"):
        await vault.set_secret(OWNER, "mail.password", VALUE)
        await vault.remove_secret(OWNER, "mail.password")
    assert caplog.messages == [
        "secret mail.password set by ann",
        "secret mail.password removed by ann",
    ]


def test_open_makes_the_directories_and_drops_cut_off_writes(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "home")
    vault.open()
    place = vault.app_directory("a")
    (place / ".a.k.cred.1a2b3c4d.tmp").write_text("half")
    (place / "a.k.cred").write_text("sealed")
    (vault.directory / ".x.cred.1a2b3c4d.tmp").write_text("half")
    vault.open()
    assert files(vault.directory) == ["apps/a/a.k.cred"]
    assert sorted(p.name for p in vault.directory.iterdir()) == ["apps", "box"]
    assert vault.names() == ["a.k"]


def test_the_units_load_their_owners_secrets_by_the_same_name() -> None:
    broker = (REPO / "units" / "box-broker@.service").read_text()
    assert f"LoadCredentialEncrypted={CREDENTIAL_ID}:/var/lib/box/vault/box\n" in broker
    runner = (REPO / "units" / "box-app@.service").read_text()
    assert f"LoadCredentialEncrypted={CREDENTIAL_ID}:/var/lib/box/vault/apps/%i\n" in runner
    assert credential_name("mail.password") == "vault_mail.password.cred"


def test_a_tool_gets_only_the_secrets_it_declares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What systemd leaves in the broker's $CREDENTIALS_DIRECTORY for a vault of three secrets.
    for name, value in (("mail.password", "pw\n"), ("mail.user", "box"), ("wallet.key", "k")):
        (tmp_path / credential_name(name)).write_text(value)
    (tmp_path / "mail.user").write_text("not from the vault")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert read_secrets(("mail.server", "mail.user", "mail.password")) == {
        "mail.user": "box",
        "mail.password": "pw\n",
    }
    assert read_secrets(()) == {}
    assert read_secrets(("../wallet.key", "vault_wallet.key.cred")) == {}
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    assert read_secrets(("mail.user",)) == {}


async def test_each_change_is_counted_once_made_and_a_refused_one_is_not(vault: Vault) -> None:
    # A spare's broker started ahead holds the vault of when it started: the manager tells it
    # is stale by this count (boxd/manager/spares.py).
    assert vault.changes == 0
    await vault.set_secret(OWNER, "mail.password", VALUE)
    assert vault.changes == 1
    with pytest.raises(BoxError):
        await vault.set_secret(OWNER, "mail.password", "")
    with pytest.raises(BoxError):
        await vault.set_secret(OWNER, "GITHUB_TOKEN", VALUE)
    with pytest.raises(BoxError):
        await vault.remove_secret(OWNER, "no.such")
    assert vault.changes == 1
    await vault.remove_secret(OWNER, "mail.password")
    assert vault.changes == 2
