"""The OpenAPI document's words and bodies for the owner's changes (boxd/web/uploads.py): what
boxd/web/openapi.py's routes table says of them, kept here so that file stays one page."""

from typing import Any

_BYTES: dict[str, Any] = {"schema": {"type": "string", "format": "binary"}}
# PUT: one file's bytes, as `curl -T` sends them.
ONE: dict[str, Any] = {"application/octet-stream": _BYTES}
# POST: several files as multipart (a filename may be a relative path, as a browser sends a
# folder picked whole), or a tar, plain or gzip-compressed.
MANY: dict[str, Any] = {
    "application/x-tar": _BYTES,
    "application/gzip": _BYTES,
    "multipart/form-data": {
        "schema": {
            "type": "object",
            "properties": {
                "file": {
                    "type": "array",
                    "items": {"type": "string", "format": "binary"},
                    "description": "files; a filename may be a relative path (folder/file)",
                }
            },
        }
    },
}
_CHANGE = (
    " An owner's change: a task of worker owner, done from the start, whose layer the next tasks "
    "see and which is undone like a task."
)
PUT_ONE = "Put one file in a workspace (the body is its bytes, as curl -T sends them)." + _CHANGE
ADD_MANY = "Add files or folders to a workspace (multipart, or a tar or gzip tar)." + _CHANGE
ADD_UNDER = "Add files or folders under a folder of a workspace." + _CHANGE
DELETE_ONE = "Delete a file or a folder from a workspace." + _CHANGE
RENAME = "Rename or move a file or folder in a workspace." + _CHANGE
