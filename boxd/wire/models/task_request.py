"""The body of `POST /api/tasks` and of D-Bus `CreateTask`: every field, default and limit of
docs/spec/start-a-task.txt. The manager is the only place it is checked, so both doors share the
rules."""

import base64
import binascii
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from boxd.errors import BoxError
from boxd.net.hosts import check_hosts
from boxd.reading.caps import MAX_LABEL, MAX_TOOLS
from boxd.reading.strict_json import loads
from boxd.wire.claude_models import resolve_model
from boxd.wire.models.plain_errors import invalid, plain

MAX_TITLE = 200
MAX_PROMPT = 100_000
MAX_BUDGET_CENTS = 100_000
MAX_WORKSPACE = 100


class Worker(StrEnum):
    DROID = "droid"
    CLAUDE = "claude"
    FAKE = "fake"


# The workers that run a model agent: their tasks get a model, and `droid`'s autonomy and plan.
AGENTS = frozenset({Worker.DROID, Worker.CLAUDE})


class Autonomy(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


def checked_hosts(value: object, field: str = "hosts") -> list[str]:
    """Host rules in their canonical forms, or a validator's error in boxd.net.hosts' words,
    which name the field `hosts` (Settings' is `defaultHosts`)."""
    try:
        return check_hosts(value)
    except BoxError as error:
        raise plain(error.message.replace("hosts", field, 1)) from None


def budget_cents(value: object, field: str = "budgetCents") -> int:
    # bool is an int to Python but never a budget; 50.0 is not "a whole number" on the wire.
    if type(value) is not int or not 0 <= value <= MAX_BUDGET_CENTS:
        raise plain(f"{field} must be a whole number from 0 to {MAX_BUDGET_CENTS}")
    return value


def _model(value: object) -> str:
    if not isinstance(value, str):
        raise plain("model must be a string")
    try:
        return resolve_model(value)
    except BoxError as error:
        raise plain(error.message) from None


class DroidOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    plan: StrictBool = False
    autonomy: Autonomy = Autonomy.LOW


MAX_FILES = 8
MAX_FOLDERS = 10
MAX_PATH = 4096


def _absolute(field: str, path: str) -> None:
    if not path.startswith("/") or "\0" in path or len(path) > MAX_PATH:
        raise plain(f"{field}: {path!r} is not an absolute path to a folder")


MAX_FILES_BYTES = 5 * 1024 * 1024


def _file_name(value: object) -> str:
    if not isinstance(value, str):
        raise plain("files: a name must be a string")
    if value in ("", ".", "..") or "/" in value or "\0" in value or len(value.encode()) > 255:
        raise plain(f"files: {value!r} is not a plain file name")
    return value


def _content(value: object) -> bytes:
    if not isinstance(value, str):
        raise plain("files: content must be base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise plain("files: content is not valid base64") from None


class SharedFile(BaseModel):
    # Not a docstring: the OpenAPI document shows it, and boxd runs without docstrings
    # (units/python.env).
    __doc__ = "A file shared to a new task: a plain name and its contents, base64 on the wire."

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, BeforeValidator(_file_name)]
    content: Annotated[bytes, BeforeValidator(_content)]


class TaskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    title: StrictStr
    prompt: StrictStr
    workspace: StrictStr = "home"
    # Checked by _known_worker, which names an unknown one; the schema lists the known ones.
    worker: Annotated[
        StrictStr,
        Field(
            description="The agent that works on the task: droid, claude (Claude Code) or fake",
            json_schema_extra={"enum": [worker.value for worker in Worker]},
        ),
    ] = Worker.DROID.value
    tools: list[StrictStr] = []
    hosts: Annotated[list[str], BeforeValidator(checked_hosts)] | None = None
    model: Annotated[str, BeforeValidator(_model)] | None = None
    budgetCents: Annotated[int, BeforeValidator(budget_cents)] | None = None
    source: StrictStr = "api"
    seat: StrictStr | None = None
    droid: DroidOptions = DroidOptions()
    folder: StrictStr | None = None
    folders: list[StrictStr] | None = None
    files: list[SharedFile] | None = None

    @field_validator("title", "prompt")
    @classmethod
    def _present(cls, value: str, info: Any) -> str:
        if not value.strip():
            raise plain(f"{info.field_name} is missing")
        limit = MAX_TITLE if info.field_name == "title" else MAX_PROMPT
        if len(value) > limit:
            raise plain(f"{info.field_name} is over {limit:,} characters")
        return value

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[str]) -> list[str]:
        if len(value) > MAX_TOOLS:
            raise plain(f"tools has {len(value)} names; at most {MAX_TOOLS} are allowed")
        for name in value:
            if len(name) > MAX_LABEL:
                raise plain(f"tools: a tool's name is at most {MAX_LABEL} characters")
        return value

    @field_validator("worker")
    @classmethod
    def _known_worker(cls, value: str) -> str:
        if value not in set(Worker):
            *others, last = (worker.value for worker in Worker)
            known = f"{', '.join(others)} and {last}"
            raise plain(f"unknown worker {value[:MAX_LABEL]!r}; this box has {known}")
        return value

    @field_validator("workspace")
    @classmethod
    def _workspace(cls, value: str) -> str:
        # A workspace's name is at most 100 characters; a longer one names none.
        if len(value) > MAX_WORKSPACE:
            raise plain(f"workspace is over {MAX_WORKSPACE} characters")
        return value

    @field_validator("source", "seat")
    @classmethod
    def _label(cls, value: str | None, info: Any) -> str | None:
        if value is not None and len(value) > MAX_LABEL:
            raise plain(f"{info.field_name} is over {MAX_LABEL} characters")
        return value

    @field_validator("folder")
    @classmethod
    def _folder(cls, value: str | None) -> str | None:
        if value is not None:
            _absolute("folder", value)
        return value

    @field_validator("folders")
    @classmethod
    def _folders(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not 1 <= len(value) <= MAX_FOLDERS:
            raise plain(f"folders: name 1 to {MAX_FOLDERS} folders, not {len(value)}")
        for folder in value:
            _absolute("folders", folder)
        return value

    @field_validator("files")
    @classmethod
    def _files(cls, files: list[SharedFile] | None) -> list[SharedFile] | None:
        if files is None:
            return None
        if not 1 <= len(files) <= MAX_FILES:
            raise plain(f"files: share 1 to {MAX_FILES} files, not {len(files)}")
        names = [file.name for file in files]
        for name in names:
            if names.count(name) > 1:
                raise plain(f"files: two files are named {name!r}")
        if sum(len(file.content) for file in files) > MAX_FILES_BYTES:
            raise plain("files: the files are over 5 MB in all")
        return files

    @model_validator(mode="after")
    def _one_place(self) -> "TaskRequest":
        if self.folder is not None and self.folders is not None:
            raise plain("send folder or folders, not both")
        personal = "folder" if self.folder is not None else "folders"
        if (self.folder is not None or self.folders is not None) and (
            "workspace" in self.model_fields_set
        ):
            raise plain(f"{personal} replaces workspace: send one of them, not both")
        return self

    @property
    def personal(self) -> list[str] | None:
        """The real folders asked for, or None for a task on a workspace."""
        if self.folder is not None:
            return [self.folder]
        return list(self.folders) if self.folders is not None else None

    @model_validator(mode="after")
    def _files_bring_their_own_workspace(self) -> "TaskRequest":
        if self.files is not None:
            for other in ("workspace", "folder", "folders"):
                if other in self.model_fields_set:
                    raise plain(
                        "files go to a new workspace of their own, so a task with files "
                        f"cannot also name {other}"
                    )
        return self


def parse_task_request(body: str | bytes) -> TaskRequest:
    loads(body)
    try:
        return TaskRequest.model_validate_json(body)
    except ValidationError as error:
        raise invalid(error) from None
