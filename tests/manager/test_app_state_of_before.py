"""The apps' state of a box of before, made safe to hand to each app's user
(boxd.manager.app_state_of_before): no file with two names across apps, no folder of an app not
installed."""

import os
from pathlib import Path

from boxd.manager.app_state_of_before import split_state


def test_a_link_made_before_hands_no_app_another_apps_file(tmp_path: Path) -> None:
    """The attacker's app, when every app ran as boxd-broker, hard-linked the wallet's ledger
    into its own folder, and made the folder of an app not installed yet: systemd would give
    the ledger's inode to the attacker's user, and the folder to that app when it came."""
    apps, aside = tmp_path / "apps", tmp_path / "apps-of-before"
    (apps / "wallet").mkdir(parents=True)
    (apps / "echo" / "deep").mkdir(parents=True)
    (apps / "later").mkdir()
    ledger = apps / "wallet" / "ledger.db"
    ledger.write_bytes(b"the wallet's bookings")
    ledger.chmod(0o600)
    os.link(ledger, apps / "echo" / "deep" / "stolen")
    (apps / "later" / "planted").write_text("for the app installed next")
    (apps / "stray").write_text("not a folder")
    (apps / "echo" / "own").write_text("echo's own")

    done = split_state(apps, frozenset({"echo", "wallet"}), aside)

    stolen = apps / "echo" / "deep" / "stolen"
    assert stolen.read_bytes() == b"the wallet's bookings"
    assert stolen.stat().st_ino != ledger.stat().st_ino
    assert (ledger.stat().st_nlink, stolen.stat().st_nlink) == (1, 1)
    assert oct(stolen.stat().st_mode & 0o777) == "0o600"
    assert sorted(os.listdir(apps)) == ["echo", "wallet"]
    assert sorted(os.listdir(aside)) == ["later", "stray"]
    assert (aside / "later" / "planted").read_text() == "for the app installed next"
    assert oct(aside.stat().st_mode & 0o777) == "0o700"
    assert done == [
        "echo/deep/stolen had other names: it is a copy of its own now",
        f"later moved to {aside / 'later'}",
        f"stray moved to {aside / 'stray'}",
    ]
    # Nothing left of the copying, and the app's own files as they were.
    assert sorted(os.listdir(apps / "echo")) == ["deep", "own"]
    assert (apps / "echo" / "own").read_text() == "echo's own"


def test_a_link_out_of_the_folder_is_not_followed(tmp_path: Path) -> None:
    apps = tmp_path / "apps"
    (apps / "echo").mkdir(parents=True)
    secret = tmp_path / "root-only"
    secret.write_text("root's")
    (apps / "echo" / "link").symlink_to(secret)
    (apps / "wallet").symlink_to(tmp_path)
    split_state(apps, frozenset({"echo", "wallet"}), tmp_path / "aside")
    assert (apps / "echo" / "link").is_symlink()
    assert os.listdir(tmp_path / "aside") == ["wallet"]
    assert secret.read_text() == "root's"
