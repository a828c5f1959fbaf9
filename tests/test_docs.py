"""The documentation holds together: a README a newcomer reads in two minutes, links that lead
somewhere, the API's contract in the repository, and no file that points outside it."""

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_LINES = 200
SPEC = ("broker-api.txt", "start-a-task.txt")
# Spelled in two pieces so that this file does not name what it looks for.
OUTSIDE = ".." + "/shared"

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench/README.md"]


def prose(text: str) -> str:
    """The text with code blocks and code spans taken out: what is in them is not a link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: its words in lower case, punctuation dropped, spaces
    as hyphens."""
    words = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", words).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        name = anchor(heading)
        number = 0
        while (name if number == 0 else f"{name}-{number}") in found:
            number += 1
        found.add(name if number == 0 else f"{name}-{number}")
    return found


def links(page: Path) -> Iterator[str]:
    for target in LINK.findall(prose(page.read_text())):
        if not re.match(r"[a-z][a-z0-9+.-]*:", target):
            yield target


def tracked() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return [
            path
            for path in ROOT.rglob("*")
            if path.is_file() and not any(part.startswith(".") for part in path.parts)
        ]
    return [ROOT / name for name in listed.decode().split("\0") if name]


def test_the_readme_is_read_in_two_minutes() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_LINES, f"README.md has {lines} lines: move some into docs/"


def test_the_apis_contract_is_in_the_repository() -> None:
    for name in SPEC:
        spec = ROOT / "docs/spec" / name
        assert spec.is_file(), f"{spec} is missing"
        assert spec.stat().st_size > 0, f"{spec} is empty"


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_link_leads_to_a_file_and_a_heading_that_exist(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, heading = target.partition("#")
        goal = (page.parent / path).resolve() if path else page
        if not goal.exists() or not goal.is_relative_to(ROOT):
            broken.append(f"{target}: no file {goal}")
        elif heading and goal.suffix == ".md" and heading not in anchors(goal):
            broken.append(f"{target}: no heading #{heading} in {goal.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_every_page_of_docs_is_linked_from_the_readme() -> None:
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(ROOT / "README.md")}
    missing = [page.name for page in (ROOT / "docs").glob("*.md") if page not in linked]
    assert not missing, f"README.md links none of {missing}"


def test_no_file_points_outside_the_repository() -> None:
    pointing = []
    for path in tracked():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        if OUTSIDE in text:
            pointing.append(str(path.relative_to(ROOT)))
    assert not pointing, f"these refer to {OUTSIDE}, which is not in the repository: {pointing}"
