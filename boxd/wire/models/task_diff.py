"""The review of what a task changed (`DiffTask`, `GET /api/tasks/{id}/diff`, `boxctl diff`): the
wire shape, one model for the manager that makes it and for the OpenAPI document.

Every text here was written by the task (names, link targets, contents): a reader shows it with
control characters made visible, as boxctl does.
"""

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

# A file's diff text, in characters; beyond, it is cut at a line and `truncated` says so.
MAX_DIFF_TEXT = 256 * 1024
# A side (the task's copy, or what it replaces) larger than this is not read: `tooLarge`.
MAX_DIFF_READ = 1024 * 1024
# One file's diff, in seconds; beyond, it is not shown (`notShown` says why).
MAX_DIFF_SECONDS = 5
# A page of the review ends early, with `next`, once making it took this long.
PAGE_SECONDS = 2
# Entries in one review; beyond, the list stops and the review's `truncated` says so.
MAX_DIFF_FILES = 1000


class Change(StrEnum):
    ADDED = "added"
    CHANGED = "changed"
    DELETED = "deleted"


class Kind(StrEnum):
    FILE = "file"
    LINK = "link"
    DIR = "dir"
    OTHER = "other"


class FileChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        description=(
            "Relative to the task's view (for several folders, the folder's name first). Bytes "
            "that are not UTF-8 are shown as \\xNN, and nameNotUtf8 says so."
        )
    )
    change: Change
    kind: Kind = Field(
        description=(
            "What is there now (for deleted: what was). An added or deleted folder is an entry "
            "of its own, and so is each file in it."
        )
    )
    oldKind: Kind | None = Field(None, description="Changed from another kind: what it was.")
    binary: bool | None = Field(
        None, description="A file with a NUL byte or not UTF-8: named, with no diff text."
    )
    diff: str | None = Field(
        None, description="A text file's unified diff (diff -u), a/ and b/ names."
    )
    truncated: bool | None = Field(
        None, description=f"The diff text was cut at {MAX_DIFF_TEXT:,} characters."
    )
    tooLarge: bool | None = Field(
        None, description=f"A side is over {MAX_DIFF_READ:,} bytes: not read, no diff text."
    )
    size: int | None = Field(None, description="The new file's size in bytes.")
    oldSize: int | None = Field(None, description="The old file's size in bytes.")
    target: str | None = Field(None, description="A link's target text (the new one).")
    oldTarget: str | None = Field(None, description="A link's old target text.")
    nameNotUtf8: bool | None = None
    notShown: str | None = Field(
        None,
        description=(
            "Why its contents are not shown: it could not be read (a running task changed it), "
            f"or its diff took over {MAX_DIFF_SECONDS} seconds to make."
        ),
    )
    skipped: str | None = Field(
        None, description="Personal tasks: why keep would leave this entry out."
    )


class TaskDiff(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    workspace: str
    state: str
    review: str | None = None
    against: str = Field(
        description=(
            "What the changes are compared with: the workspace as the task saw it when it "
            "started (its base and the layers in saw still on the box)."
        )
    )
    truncated: bool = Field(
        description=f"More than {MAX_DIFF_FILES:,} entries: the list stops there."
    )
    files: list[FileChange]
