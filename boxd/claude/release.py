"""The one Claude Code release this box runs, and where boxd installs it.

Pinned as Droid is (boxd/droid/release.py): Anthropic's platform package for Linux x86-64 at one
exact version, checked against the integrity the npm registry publishes for it. The package
`@anthropic-ai/claude-code` is a Node.js wrapper that wants Node 22, newer than Debian 13's and
12's; the platform package holds the native binary, which is all Claude Code needs.
"""

from pathlib import Path

VERSION = "2.1.337"
PACKAGE = "@anthropic-ai/claude-code-linux-x64"
# `npm view @anthropic-ai/claude-code-linux-x64@2.1.337 dist.integrity`
INTEGRITY = (
    "sha512-Wce/AADPVSsX4txVsbtajQ8dHgqUZo5JP6DskT91BUHEMsnzlO4oodZMXpc8skllMfIdj6s3sd6ClGQ6eb"
    "nOAg=="
)
# The binary inside the package's tarball.
BINARY_IN_PACKAGE = "package/claude"
# Root's, read-only to everyone else; a worker's sandbox (ProtectSystem=strict) sees it as is.
CLAUDE_DIR = Path("/var/lib/boxd/claude")
NAME = f"Claude Code {VERSION}"
# The machine's Claude Code policy, which Claude Code reads whatever its --setting-sources say;
# hidden from tasks (boxd/manager/units/sandbox.py).
MANAGED_POLICY = Path("/etc/claude-code")


def claude_binary(version: str = VERSION) -> Path:
    return CLAUDE_DIR / version / "claude"
