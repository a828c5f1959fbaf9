"""The vault's own rules, with a stand-in for systemd-creds (the real one is in tests/vm), and
how a broker hands a tool the secrets it declared, and no others."""

import base64
import logging
import stat
from pathlib import Path

import pytest

from boxd.broker.credentials import read_secrets
from boxd.caller import Caller, Role
from boxd.errors import BoxError, Problem
from boxd.manager.vault import MAX_VALUE, Vault, check_name
from boxd.secret_names import CREDENTIAL_ID, credential_name

REPO = Path(__file__).resolve().parents[1]
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


async def test_set_list_and_remove(vault: Vault, tmp_path: Path) -> None:
    assert await vault.set_secret(OWNER, ["mail.password", VALUE]) == {"name": "mail.password"}
    assert await vault.set_secret(OWNER, ["a-token_2", "x"]) == {"name": "a-token_2"}
    assert await vault.list_secrets(OWNER, []) == ["a-token_2", "mail.password"]
    sealed = vault.directory / "mail.password.cred"
    assert base64.b64decode(sealed.read_bytes()).decode() == f"vault_mail.password.cred\n{VALUE}"
    assert stat.S_IMODE(sealed.stat().st_mode) == 0o600
    assert stat.S_IMODE(vault.directory.stat().st_mode) == 0o700
    argv = (tmp_path / "bin" / "argv").read_text()
    assert VALUE not in argv
    assert "--name=vault_mail.password.cred - -" in argv
    assert await vault.remove_secret(OWNER, ["a-token_2"]) == {"name": "a-token_2"}
    assert await vault.list_secrets(OWNER, []) == ["mail.password"]
    assert sorted(p.name for p in vault.directory.iterdir()) == ["mail.password.cred"]


async def test_setting_again_replaces(vault: Vault) -> None:
    await vault.set_secret(OWNER, ["mail.user", "old"])
    await vault.set_secret(OWNER, ["mail.user", "new"])
    sealed = (vault.directory / "mail.user.cred").read_bytes()
    assert base64.b64decode(sealed).decode().endswith("\nnew")
    assert sorted(p.name for p in vault.directory.iterdir()) == ["mail.user.cred"]


async def test_removing_what_is_not_there(vault: Vault) -> None:
    with pytest.raises(BoxError) as caught:
        await vault.remove_secret(OWNER, ["nothing.here"])
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
        ("", Problem.INVALID, "the value of k is empty; boxctl vault rm k removes it"),
        ("a\0b", Problem.INVALID, "the value of k holds a NUL character; secrets are text"),
        (
            "v" * (MAX_VALUE + 1),
            Problem.TOO_LARGE,
            f"the value of k is {MAX_VALUE + 1} bytes; a secret holds at most {MAX_VALUE} bytes",
        ),
    ]
    for value, problem, message in cases:
        with pytest.raises(BoxError) as caught:
            await vault.set_secret(OWNER, ["k", value])
        assert (caught.value.problem, caught.value.message) == (problem, message)
    assert await vault.list_secrets(OWNER, []) == []


async def test_the_vault_stays_within_what_systemd_loads(vault: Vault) -> None:
    # systemd 252 starts no unit whose credentials pass 1 MiB, names included: 15 secrets of
    # 64 KiB load, 16 do not (seen with LoadCredentialEncrypted= on Debian 12).
    for number in range(15):
        await vault.set_secret(OWNER, [f"s{number}", "v" * MAX_VALUE])
    with pytest.raises(BoxError) as caught:
        await vault.set_secret(OWNER, ["s15", "v" * MAX_VALUE])
    assert caught.value.problem == Problem.TOO_LARGE
    assert "would pass 1024 KiB in all with s15" in caught.value.message
    await vault.set_secret(OWNER, ["s0", "v" * MAX_VALUE])  # replacing one still fits
    await vault.set_secret(OWNER, ["s15", "small"])


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
        await vault.set_secret(OWNER, ["mail.password", VALUE])
    assert caught.value.problem == Problem.FAILED
    assert caught.value.message == (
        f"systemd-creds could not encrypt mail.password (exit status 1){why}"
    )
    assert await vault.list_secrets(OWNER, []) == []


async def test_a_missing_systemd_creds(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "home", encrypt=(str(tmp_path / "no-such-program"),))
    vault.open()
    with pytest.raises(BoxError, match=r"cannot keep k: .*no-such-program is not installed"):
        await vault.set_secret(OWNER, ["k", VALUE])


async def test_the_journal_names_secrets_and_never_their_values(
    vault: Vault, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="boxd.manager.vault"):
        await vault.set_secret(OWNER, ["mail.password", VALUE])
        await vault.remove_secret(OWNER, ["mail.password"])
    assert caplog.messages == [
        "secret mail.password set by ann",
        "secret mail.password removed by ann",
    ]


def test_open_makes_the_directory_and_drops_cut_off_writes(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "home")
    vault.open()
    (vault.directory / ".k.cred.1a2b3c4d.tmp").write_text("half")
    (vault.directory / "k.cred").write_text("sealed")
    vault.open()
    assert sorted(p.name for p in vault.directory.iterdir()) == ["k.cred"]
    assert vault.names() == ["k"]


def test_the_broker_unit_loads_the_vault_by_the_same_name() -> None:
    unit = (REPO / "units" / "box-broker@.service").read_text()
    assert f"LoadCredentialEncrypted={CREDENTIAL_ID}:/var/lib/box/vault\n" in unit
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
    # is stale by this count (boxd/manager/box.py).
    assert vault.changes == 0
    await vault.set_secret(OWNER, ["mail.password", VALUE])
    assert vault.changes == 1
    with pytest.raises(BoxError):
        await vault.set_secret(OWNER, ["mail.password", ""])
    with pytest.raises(BoxError):
        await vault.remove_secret(OWNER, ["no.such"])
    assert vault.changes == 1
    await vault.remove_secret(OWNER, ["mail.password"])
    assert vault.changes == 2
