"""No file of boxd is over MAX_LINES lines (issue 33): a longer one holds more than one concept,
and is split along its seams into modules named for what they do."""

from pathlib import Path

BOXD = Path(__file__).resolve().parents[1] / "boxd"
MAX_LINES = 600


def test_no_file_of_boxd_is_over_600_lines() -> None:
    long = {
        str(path.relative_to(BOXD.parent)): lines
        for path in sorted(BOXD.rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
