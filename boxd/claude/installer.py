"""`boxd claude-install`: puts the pinned Claude Code binary at `claude_binary()`, as
boxd-claude-install.service runs it, by the agents' installer (boxd/agents/installer.py):
the whole tarball checked against the pinned integrity before anything in it is read, and only
the binary taken from it."""

from boxd.agents.installer import Pin
from boxd.agents.installer import failure_reason as _failure_reason
from boxd.agents.installer import main as _main
from boxd.claude import release

CLAUDE = Pin(
    name=release.NAME,
    package=release.PACKAGE,
    version=release.VERSION,
    integrity=release.INTEGRITY,
    member=release.BINARY_IN_PACKAGE,
    binary="claude",
    directory=release.CLAUDE_DIR,
)


def failure_reason(line: str) -> str | None:
    return _failure_reason(line, CLAUDE)


def main() -> None:
    _main(CLAUDE)
