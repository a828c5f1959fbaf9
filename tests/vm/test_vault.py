"""The vault with the real systemd-creds, polkit and LoadCredentialEncrypted=: the owner's
secrets reach the tools of their own app that declare them, through a real SMTP server, and
nowhere else."""

import base64
import binascii
import json
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import testbed
from boxd.wire.caller import OWNER_ONLY
from testbed.box_api import (
    BOXCTL,
    boxctl,
    busctl_call,
    database_bytes,
    finish,
    start_fake,
    wait_for_step,
)
from testbed.image import TEST_VENV
from testbed.machine import Machine
from testbed.vault import vault_names, vault_set

VAULT = "/var/lib/box/vault"
REFUSED = "Only the box's owner may do this"
SMTP_PORT = 2525
SMTP_USER = "box"
SMTP_DIR = "/run/smtp-test"
SEND = 'call mail.send {"to": "ann@example.com", "subject": "Hi", "body": "Hello"}'


def contains(text: str, value: str) -> bool:
    """The value in clear, or base64-encoded as systemd-creds writes its files."""
    return value in text or value.encode() in _unbase64(text)


def _unbase64(text: str) -> bytes:
    try:
        return base64.b64decode(text)
    except (binascii.Error, ValueError):
        return b""


@dataclass(frozen=True)
class Smtp:
    password: str
    server: str
    inbox: str

    def messages(self, machine: Machine) -> list[dict[str, Any]]:
        done = machine.run("cat", self.inbox, check=False)
        return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture(scope="module")
def smtp(machine: Machine) -> Iterator[Smtp]:
    """A real SMTP server on 127.0.0.1 in the machine, where the brokers run; it takes mail
    only after a login with a password made for this test."""
    password = secrets.token_urlsafe(24)
    folder = machine.root / SMTP_DIR.lstrip("/")
    folder.mkdir(mode=0o700, exist_ok=True)
    shutil.copyfile(Path(testbed.__file__).with_name("smtp_server.py"), folder / "server.py")
    (folder / "password").write_text(password)
    (folder / "password").chmod(0o600)
    inbox = f"{SMTP_DIR}/inbox.jsonl"
    # Type=notify: systemd-run returns once the server listens. The password stays in its file:
    # a command line would show in the journal as the unit's description.
    machine.run(
        "systemd-run",
        "--unit=smtp-test",
        "--property=Type=notify",
        "--property=NotifyAccess=all",
        f"{TEST_VENV}/bin/python",
        f"{SMTP_DIR}/server.py",
        str(SMTP_PORT),
        SMTP_USER,
        f"{SMTP_DIR}/password",
        inbox,
    )
    try:
        yield Smtp(password=password, server=f"127.0.0.1:{SMTP_PORT}", inbox=inbox)
    finally:
        machine.run("systemctl", "stop", "smtp-test.service", check=False)


def test_set_list_and_remove_with_boxctl(machine: Machine, owner: str) -> None:
    value = secrets.token_urlsafe(24)
    vault_set(machine, "test.api-key", value + "\n", user=owner)
    vault_set(machine, "test.other", "something else", user=owner)
    listed = boxctl(machine, "vault", "ls", user=owner).stdout.splitlines()
    assert listed[0].split() == ["NAME", "BELONGS", "TO"]
    ours = [line.split(None, 1) for line in listed if line.startswith("test.")]
    assert ours == [
        ["test.api-key", "app test: its tools only"],
        ["test.other", "app test: its tools only"],
    ]
    assert {"test.api-key", "test.other"} <= set(vault_names(machine))
    sealed = f"{VAULT}/apps/test/test.api-key.cred"
    for directory in (VAULT, f"{VAULT}/apps", f"{VAULT}/apps/test"):
        assert machine.run("stat", "-c", "%U %a", directory).stdout.split() == ["root", "700"]
    assert machine.run("stat", "-c", "%U %a", sealed).stdout.split() == ["root", "600"]
    assert not contains(machine.run("cat", sealed).stdout, value)
    # Encrypted with the host's key under the name systemd gives it in a broker; boxctl took
    # the newline off the end.
    decrypt = ("systemd-creds", "decrypt", "--name=vault_test.api-key.cred", sealed, "-")
    assert machine.run(*decrypt).stdout == value
    vault_set(machine, "test.api-key", "replaced", user=owner)
    assert machine.run(*decrypt).stdout == "replaced"
    assert boxctl(machine, "vault", "rm", "test.api-key", user=owner).stdout == ""
    boxctl(machine, "vault", "rm", "test.other")
    assert not {"test.api-key", "test.other"} & set(vault_names(machine))
    again = boxctl(machine, "vault", "rm", "test.api-key", check=False)
    assert again.returncode == 1
    assert again.stderr.strip() == "boxctl: no secret test.api-key in the vault"
    leftovers = machine.run("find", VAULT, "-type", "f").stdout.split()
    assert not [name for name in leftovers if "/test." in name]


def test_bad_names_and_values_are_refused_in_plain_words(machine: Machine) -> None:
    bad = vault_set(machine, "../etc/shadow", "x", check=False)
    assert bad.returncode == 1
    assert "'../etc/shadow' is not a secret name" in bad.stderr
    empty = vault_set(machine, "test.empty", "\n", check=False)
    assert empty.stderr.strip() == (
        "boxctl: the value of test.empty is empty; boxctl vault rm test.empty removes it"
    )
    big = "A" * 65_537
    large = vault_set(machine, "test.large", big, check=False)
    assert large.returncode == 1
    assert large.stderr.strip() == (
        "boxctl: the value of test.large is 65537 bytes; a secret holds at most 65536 bytes"
    )
    assert not {"test.empty", "test.large"} & set(vault_names(machine))


def test_only_the_owner_may_use_the_vault(machine: Machine, owner: str) -> None:
    machine.run("sh", "-c", "id stranger >/dev/null 2>&1 || useradd -m stranger")
    for args in (("set", "test.stolen"), ("rm", "test.stolen"), ("ls",)):
        refused = machine.run(BOXCTL, "vault", *args, user="stranger", input="value", check=False)
        assert refused.returncode == 1
        assert refused.stderr.startswith(f"boxctl: {REFUSED}")
    over_busctl = busctl_call(
        machine, "SetSecret", "test.stolen", "v", user="stranger", check=False
    )
    assert over_busctl.returncode != 0 and REFUSED in over_busctl.stderr
    assert "test.stolen" not in vault_names(machine)
    # Secrets are set by the owner and read by brokers only: the files are root's.
    peek = machine.run("ls", VAULT, user=owner, check=False)
    assert peek.returncode != 0 and "Permission denied" in peek.stderr


def test_no_door_reads_a_secret_and_no_token_writes_one(machine: Machine, token: str) -> None:
    shown = machine.run(
        "busctl", "introspect", "--list", "org.boxd.Box1", "/org/boxd/Box1"
    ).stdout.splitlines()
    methods = {line.split()[0] for line in shown if " method " in f" {line} "}
    assert {".SetSecret", ".RemoveSecret", ".ListSecrets"} <= methods
    # Values go in, never out, on any interface.
    assert {m for m in methods if "Secret" in m} == {".SetSecret", ".RemoveSecret", ".ListSecrets"}
    # On the gateway's, for the screen and a paired device; an owner's token is refused.
    refused = machine.run(
        "busctl", "call", "org.boxd.Box1", "/org/boxd/Box1", "org.boxd.Box1.Gateway",
        "SetSecret", "sss", token, "test.stolen", "v", user="nobody", check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and OWNER_ONLY in refused.stderr, refused.stderr
    assert "test.stolen" not in vault_names(machine)


def test_a_broker_starts_with_an_empty_vault(machine: Machine, token: str) -> None:
    for name in vault_names(machine):
        boxctl(machine, "vault", "rm", name)
    assert machine.run("find", VAULT, "-type", "f").stdout == ""
    task = start_fake(machine, token, "step nothing secret here")
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["nothing secret here"]


def test_a_secret_set_with_boxctl_reaches_the_mail_tool(
    machine: Machine, token: str, owner: str, smtp: Smtp
) -> None:
    mail = {
        "mail.server": smtp.server,
        "mail.user": SMTP_USER,
        "mail.password": smtp.password,
        "mail.from": "box@example.com",
    }
    for name, value in mail.items():
        vault_set(machine, name, value + "\n", user=owner)
    try:
        _mail_goes_out(machine, token, owner, smtp)
    finally:
        for name in set(mail) & set(vault_names(machine)):
            boxctl(machine, "vault", "rm", name)


def _mail_goes_out(machine: Machine, token: str, owner: str, smtp: Smtp) -> None:
    task = start_fake(machine, token, f"{SEND}\nsh env", tools=["mail.send"])
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    sent, environment = (s["text"] for s in ended["steps"])
    assert sent.startswith("mail.send: ")
    assert json.loads(sent.removeprefix("mail.send: ")) == {
        "sent": True,
        "messageId": f"<{task['id']}.line-1@boxd>",
        "to": "ann@example.com",
    }
    [message] = smtp.messages(machine)
    assert message["login"] == SMTP_USER
    assert (message["from"], message["to"]) == ("box@example.com", ["ann@example.com"])
    assert "Subject: Hi" in message["message"]
    assert f"Message-ID: <{task['id']}.line-1@boxd>" in message["message"]

    # The password went to the mail server and nowhere else a task or a log could show it.
    assert f"BOX_TASK={task['id']}" in environment
    assert "CREDENTIALS_DIRECTORY" not in environment
    assert smtp.password not in environment
    assert smtp.password not in json.dumps(ended)
    machine.run("journalctl", "--sync")
    for output in ("short", "verbose"):
        journal = machine.run("journalctl", "-b", "--no-pager", "-o", output).stdout
        assert f"secret mail.password set by {owner}" in journal
        assert smtp.password not in journal
    database = database_bytes(machine)
    assert smtp.password not in database

    # A broker started after the password left the vault sends without it, and the server,
    # which wants a login, refuses.
    boxctl(machine, "vault", "rm", "mail.password")
    task = start_fake(machine, token, SEND, tools=["mail.send"])
    ended = finish(machine, task["id"])
    [step] = ended["steps"]
    assert step["text"].startswith("mail.send failed: the mail server 127.0.0.1:2525 refused")
    assert "530" in step["text"]
    assert len(smtp.messages(machine)) == 1


def test_only_the_apps_runner_holds_its_secrets(machine: Machine, token: str, owner: str) -> None:
    value = secrets.token_urlsafe(24)
    vault_set(machine, "mail.user", value, user=owner)
    vault_set(machine, "test.held", "another app's", user=owner)
    try:
        task = start_fake(machine, token, f"{SEND}\nsleep 60", tools=["mail.send"])
        wait_for_step(machine, task["id"])
        broker = f"box-broker@{task['id']}.service"
        runner = "box-app@mail.service"
        held = f"/run/credentials/{runner}"
        # The mail app's own secret, and nothing of another app's or of the box's.
        assert machine.run("ls", held).stdout.split() == ["vault_mail.user.cred"]
        # Readable by the app's user: its owner with systemd 252, root's with an ACL entry for
        # it with systemd 257 (Debian 13).
        read = machine.run("cat", f"{held}/vault_mail.user.cred", user="boxd-app-mail")
        assert read.stdout == value
        brokers = machine.run("ls", "-A", f"/run/credentials/{broker}", check=False).stdout
        assert "vault_mail.user.cred" not in brokers and "vault_test.held.cred" not in brokers
        peek = machine.run("ls", held, user=task["user"], check=False)
        assert peek.returncode != 0
        worker = f"box-task-{task['id']}.service"
        for unit in (worker, broker, runner):
            pid = machine.run("systemctl", "show", "-p", "MainPID", "--value", unit).stdout
            environ = machine.run("cat", f"/proc/{pid.strip()}/environ").stdout
            assert value not in environ
            if unit != broker:
                assert ("CREDENTIALS_DIRECTORY" in environ) == (unit == runner)
        boxctl(machine, "stop", task["id"])
    finally:
        boxctl(machine, "vault", "rm", "mail.user")
        boxctl(machine, "vault", "rm", "test.held")
