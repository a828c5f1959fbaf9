"""A box upgraded from when every broker ran every app (and loaded the whole vault) keeps each
app's state and secrets: the wallet's ledger, once the brokers' (boxd-broker), becomes the
wallet's own; a secret kept in vault/ is moved to its app's directory and reaches its runner."""

import json
from collections.abc import Iterator

import pytest

from testbed.box_api import boxctl, finish, start_fake
from testbed.machine import Machine, booted_box

PYTHON = "/usr/lib/boxd/venv/bin/python"
APPS = "/var/lib/box/apps"
# The ledger as a broker of before left it, one booking in it.
OLD_LEDGER = (
    "import sqlite3\n"
    f"db = sqlite3.connect('{APPS}/wallet/ledger.db')\n"
    "db.execute('CREATE TABLE bookings (task TEXT NOT NULL, key TEXT NOT NULL, payee TEXT NOT"
    " NULL, cents INTEGER NOT NULL, memo TEXT NOT NULL, booked_at INTEGER NOT NULL, PRIMARY KEY"
    " (task, key))')\n"
    "db.execute(\"INSERT INTO bookings VALUES ('t000000000', 'k', 'Old', 7, '', 0)\")\n"
    "db.commit()\n"
)


@pytest.fixture(scope="module")
def machine() -> Iterator[Machine]:
    """A machine of this module's own: its state is made to look older than it is."""
    yield from booted_box()


def test_a_box_of_before_keeps_its_apps_state_and_secrets(machine: Machine, token: str) -> None:
    machine.run("systemctl", "stop", "boxd.service", "box-app@wallet.service")
    machine.run("rm", "-rf", f"{APPS}/wallet")
    machine.run("mkdir", "-p", f"{APPS}/wallet")
    machine.run(PYTHON, "-c", OLD_LEDGER)
    # The attacker's app, when every app was boxd-broker: the wallet's ledger linked into its
    # own folder, and a folder made ahead for an app not installed yet.
    machine.run("rm", "-rf", f"{APPS}/echo", f"{APPS}/later", "/var/lib/box/apps-of-before")
    machine.run("mkdir", "-p", f"{APPS}/echo", f"{APPS}/later")
    machine.run("ln", f"{APPS}/wallet/ledger.db", f"{APPS}/echo/stolen")
    machine.run("sh", "-c", f"echo planted > {APPS}/later/planted")
    machine.run("chown", "-R", "boxd-broker:boxd-broker", APPS)
    machine.run("chmod", "-R", "go-rwx", APPS)
    # A secret sealed and kept where the vault kept every secret before.
    machine.run(
        "systemd-creds", "encrypt", "--with-key=host", "--name=vault_mail.user.cred", "-",
        "/var/lib/box/vault/mail.user.cred", input="the old user",
    )  # fmt: skip
    machine.run("systemctl", "start", "boxd.service")

    task = start_fake(machine, token, "call wallet.balance {}", tools=["wallet.balance"])
    ended = finish(machine, task["id"])
    assert ended["steps"][0]["text"] == 'wallet.balance: {"paidCents": 7, "payments": 1}', ended
    owners = machine.run(
        "stat", "-c", "%U %a %n", APPS, f"{APPS}/wallet", f"{APPS}/wallet/ledger.db"
    )
    assert owners.stdout.split("\n")[:3] == [
        f"root 700 {APPS}",
        f"boxd-app-wallet 700 {APPS}/wallet",
        f"boxd-app-wallet 600 {APPS}/wallet/ledger.db",
    ]
    # Before this, systemd gave the ledger's inode to whichever app's runner started first of
    # the two: now the link is a copy of its own, and the folder made ahead is nobody's state.
    links = machine.run("stat", "-c", "%i %h", f"{APPS}/wallet/ledger.db", f"{APPS}/echo/stolen")
    (ledger, ledger_names), (stolen, stolen_names) = (
        line.split() for line in links.stdout.splitlines()
    )
    assert ledger != stolen and (ledger_names, stolen_names) == ("1", "1")
    assert "later" not in machine.run("ls", APPS).stdout.split()
    aside = machine.run("stat", "-c", "%U %a", "/var/lib/box/apps-of-before").stdout.strip()
    assert aside == "root 700"
    planted = machine.run("cat", "/var/lib/box/apps-of-before/later/planted").stdout
    assert planted == "planted\n"
    secrets = json.loads(boxctl(machine, "vault", "ls", "--json").stdout)
    assert {"name": "mail.user", "belongsTo": "mail"} in secrets
    assert machine.run("ls", "/var/lib/box/vault/apps/mail").stdout.split() == ["mail.user.cred"]
    # The mail app's runner loads it, under the name it was sealed with.
    machine.run("systemctl", "start", "box-app@mail.service")
    loaded = machine.run("cat", "/run/credentials/box-app@mail.service/vault_mail.user.cred")
    assert loaded.stdout == "the old user"
