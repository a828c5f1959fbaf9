"""`boxd droid-install`: Droid's pin in the agents' installer, and its words for the manager."""

from pathlib import Path

import pytest

from boxd.droid import installer as droid_installer
from boxd.droid import release as droid_release
from boxd.droid.installer import failure_reason


def test_the_reason_survives_the_journal_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(droid_release, "DROID_DIR", tmp_path)
    monkeypatch.setenv("BOX_NPM_REGISTRY", "ftp://nowhere")
    with pytest.raises(SystemExit):
        droid_installer.main()
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert failure_reason(last) == "BOX_NPM_REGISTRY must be an http:// or https:// address, " + (
        "not 'ftp://nowhere'"
    )
    assert failure_reason("something else") is None
