"""`boxd droid-install`: puts the pinned Droid binary at `droid_binary()`, as
boxd-droid-install.service runs it, by the agents' installer (boxd/agents/installer.py)."""

from boxd.agents.installer import Pin
from boxd.agents.installer import failure_reason as _failure_reason
from boxd.agents.installer import main as _main
from boxd.droid import release

DROID = Pin(
    name=f"Droid {release.VERSION}",
    package=release.PACKAGE,
    version=release.VERSION,
    integrity=release.INTEGRITY,
    member=release.BINARY_IN_PACKAGE,
    binary="droid",
    directory=release.DROID_DIR,
)


def failure_reason(line: str) -> str | None:
    return _failure_reason(line, DROID)


def main() -> None:
    _main(DROID)
