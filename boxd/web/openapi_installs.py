"""`GET /api/droid` and `GET /api/claude` in the OpenAPI document: an agent boxd installs itself,
the release the box pins and how its install stands (the manager's InstallState.public)."""

from typing import Any

INSTALL: dict[str, Any] = {
    "type": "object",
    "description": "installed and installing both false with no error: not installed, and no "
    "install started yet (Claude Code's starts with the first Claude task)",
    "required": ["version", "installed", "installing", "error"],
    "properties": {
        "version": {"type": "string", "description": "the release the box pins"},
        "installed": {"type": "boolean"},
        "installing": {
            "type": "boolean",
            "description": "its install unit runs; the agent's tasks wait, queued, meanwhile",
        },
        "error": {
            "type": ["string", "null"],
            "description": "why it could not be installed, as its tasks fail with it; boxd "
            "tries again the next time it starts",
        },
    },
}
INSTALLS: tuple[tuple[str, str], ...] = (
    ("/api/droid", "The Droid release the box runs and its install"),
    ("/api/claude", "The Claude Code release the box runs and its install"),
)
