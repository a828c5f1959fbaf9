"""The schemas of the workspace's reading routes (boxd/web/workspace_files.py) in the OpenAPI
document (boxd/web/openapi.py)."""

from typing import Any

_WHEN = {"type": "string", "description": "ISO 8601, UTC"}
_TASK = {
    "type": ["string", "null"],
    "description": "the task that last changed it; null: it is as in the workspace's base",
}

LISTING: dict[str, Any] = {
    "type": "object",
    "required": ["workspace", "path", "entries", "truncated"],
    "properties": {
        "workspace": {"type": "string"},
        "path": {"type": "string", "description": "the folder, '' for the workspace itself"},
        "truncated": {
            "type": "boolean",
            "description": "the folder has more entries than boxd lists (10,000)",
        },
        "entries": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "kind", "size", "modified", "task"],
                "properties": {
                    "name": {"type": "string"},
                    "nameNotUtf8": {
                        "type": "boolean",
                        "description": "its bytes are not UTF-8: they show as \\xNN",
                    },
                    "kind": {"type": "string", "enum": ["file", "link", "dir", "other"]},
                    "size": {"type": "integer"},
                    "modified": _WHEN,
                    "task": _TASK,
                    "target": {
                        "type": ["string", "null"],
                        "description": "a link's target, as text; links are never followed",
                    },
                },
            },
        },
    },
}

HISTORY: dict[str, Any] = {
    "type": "object",
    "required": ["workspace", "path", "tasks", "inBase"],
    "properties": {
        "workspace": {"type": "string"},
        "path": {"type": "string"},
        "tasks": {
            "type": "array",
            "description": "the tasks that touched the path, newest first",
            "items": {
                "type": "object",
                "required": ["task", "change", "diff"],
                "properties": {
                    "task": {"type": "string"},
                    "change": {"type": "string", "enum": ["added", "changed", "deleted"]},
                    "diff": {"type": "string", "description": "where the task's diff is"},
                },
            },
        },
        "inBase": {"type": "boolean", "description": "the workspace's base has the path"},
    },
}

FILE: dict[str, Any] = {"type": "string", "format": "binary"}
FILE_MEDIA = "application/octet-stream"
READERS = (
    "the owner, or an app's or a member's token for the workspaces its limits name (any other "
    "is answered as a missing workspace)"
)
FILE_SUMMARY = (
    "A plain file's bytes: text as text/plain, a PNG, JPEG, GIF or WebP image inline, anything "
    "else as an attachment; always nosniff and Content-Security-Policy: sandbox. One range "
    "(Range: bytes=a-b) answers 206 with Content-Range; links, FIFOs and devices are refused"
)
