"""A record newer than the installed boxd (as after going back to an older .deb): the manager
refuses it in words, changes no byte of it, and stays stopped rather than being started again
every second; the record's own boxd, back, finds every task as it was."""

import pytest

from boxd.manager.record.schema import NEWEST, TOO_NEW_EXIT
from testbed.box_api import finish, start_fake, wait_for_step
from testbed.machine import Machine

PYTHON = "/usr/lib/boxd/venv/bin/python"
RECORD = "/var/lib/box/box.db"
WORDS = "Install the newer boxd again"


def _set_version(machine: Machine, version: int, crash: bool = False) -> None:
    """With `crash`, the process dies once the version is committed, before it closes the
    record: the version is in the WAL alone, and the -wal and -shm stay, as a newer boxd that
    lost power leaves them."""
    machine.run(
        PYTHON,
        "-c",
        "import os, sqlite3, sys\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        f"db.execute('PRAGMA user_version = {version:d}')\n"
        f"{'os._exit(0)' if crash else 'db.close()'}\n",
        RECORD,
    )


def _record_files(machine: Machine) -> dict[str, str]:
    """Each of the record's files (the database, and its -wal and -shm if there) by sha256."""
    found = machine.run("sh", "-c", f"sha256sum {RECORD} {RECORD}-wal {RECORD}-shm", check=False)
    files = {}
    for line in found.stdout.splitlines():
        digest, _, name = line.partition("  ")
        files[name] = digest
    return files


def _state(machine: Machine) -> dict[str, str]:
    shown = machine.run(
        "systemctl", "show", "boxd.service", "-p", "ActiveState,SubState,ExecMainStatus,NRestarts"
    )
    return dict(line.split("=", 1) for line in shown.stdout.splitlines())


@pytest.mark.parametrize("crash", [False, True], ids=["stopped", "crashed"])
def test_an_older_boxd_refuses_a_newer_record_and_leaves_it(
    machine: Machine, token: str, crash: bool
) -> None:
    done = start_fake(machine, token, "step before")
    assert finish(machine, done["id"])["state"] == "done"
    running = start_fake(machine, token, "step one\nsleep 2\nstep two")
    wait_for_step(machine, running["id"])
    machine.run("systemctl", "stop", "boxd.service")
    try:
        _set_version(machine, NEWEST + 1, crash)
        before = _record_files(machine)
        if crash:
            assert list(before) == [RECORD, f"{RECORD}-wal", f"{RECORD}-shm"]
        else:
            assert list(before) == [RECORD], "a stopped boxd leaves no -wal or -shm"

        started = machine.run("systemctl", "start", "boxd.service", check=False)
        assert started.returncode != 0

        # Failed and staying so: systemd queued no restart (SubState would be auto-restart).
        assert _state(machine) == {
            "ActiveState": "failed",
            "SubState": "failed",
            "ExecMainStatus": str(TOO_NEW_EXIT),
            "NRestarts": "0",
        }
        assert machine.run("systemctl", "list-jobs", "boxd.service").stdout.count("boxd") == 0
        # The unit's status line (`Status:` in systemctl status) and the journal say why.
        text = machine.run("systemctl", "show", "boxd.service", "-p", "StatusText", "--value")
        assert WORDS in text.stdout
        status = machine.run("systemctl", "status", "--no-pager", "-l", "boxd.service", check=False)
        assert WORDS in status.stdout, status.stdout
        assert f"version {NEWEST + 1}" in status.stdout
        assert f"versions up to {NEWEST}" in status.stdout
        journal = machine.run("journalctl", "-u", "boxd.service", "-b", "--no-pager").stdout
        assert WORDS in journal
        assert _record_files(machine) == before
    finally:
        _set_version(machine, NEWEST)
        machine.run("systemctl", "reset-failed", "boxd.service")
        machine.run("systemctl", "start", "boxd.service")
    assert finish(machine, done["id"])["state"] == "done"
    ended = finish(machine, running["id"])
    assert ended["state"] == "done", ended
    assert [s["text"] for s in ended["steps"]] == ["one", "slept 2 s", "two"]
