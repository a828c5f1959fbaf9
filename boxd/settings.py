"""The owner's settings, stored in the database, with the seed's defaults."""

from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    StrictStr,
    ValidationError,
    field_validator,
)

from boxd.errors import BoxError
from boxd.hosts import check_hosts
from boxd.plain_errors import invalid
from boxd.task_request import MAX_PATH, budget_cents, plain

MAX_AGENT_FOLDERS = 50


class NetworkDefault(StrEnum):
    NONE = "none"
    ALLOWLIST = "allowlist"


def _hosts(value: object) -> list[str]:
    try:
        return check_hosts(value)
    except BoxError as error:
        raise plain(error.message.replace("hosts", "defaultHosts", 1)) from None


# A task's worker unit gets these as MemoryMax=, TasksMax= and CPUQuota=. The defaults leave
# room for what agents run (node, compilers, test suites) without letting one task starve the box.
MIB = 1024 * 1024
MIN_MEMORY_BYTES = 64 * MIB
MAX_MEMORY_BYTES = 1024 * 1024 * MIB
MIN_TASKS, MAX_TASKS = 16, 65536
MIN_CPU_PERCENT, MAX_CPU_PERCENT = 1, 100 * 1024


def _whole(field: str, what: str, low: int, high: int) -> BeforeValidator:
    def check(value: object) -> int:
        # bool is an int to Python but never a limit; 2.0 is not a whole number on the wire.
        if type(value) is not int or not low <= value <= high:
            raise plain(f"{field} must be {what} from {low} to {high}")
        return value

    return BeforeValidator(check)


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    defaultBudgetCents: Annotated[
        int, BeforeValidator(lambda v: budget_cents(v, "defaultBudgetCents"))
    ] = 100
    defaultHosts: Annotated[list[str], BeforeValidator(_hosts)] = []
    networkDefault: NetworkDefault = NetworkDefault.NONE
    agentFolders: list[StrictStr] = []
    taskMemoryMaxBytes: Annotated[
        int,
        _whole("taskMemoryMaxBytes", "a whole number of bytes", MIN_MEMORY_BYTES, MAX_MEMORY_BYTES),
    ] = 4096 * MIB
    taskTasksMax: Annotated[
        int, _whole("taskTasksMax", "a whole number of processes", MIN_TASKS, MAX_TASKS)
    ] = 1024
    # Percent of one CPU core: 200 lets a task keep two cores busy.
    taskCPUPercent: Annotated[
        int,
        _whole(
            "taskCPUPercent", "a whole percentage of one core", MIN_CPU_PERCENT, MAX_CPU_PERCENT
        ),
    ] = 200

    @field_validator("agentFolders")
    @classmethod
    def _absolute(cls, folders: list[str]) -> list[str]:
        if len(folders) > MAX_AGENT_FOLDERS:
            raise plain(f"agentFolders names at most {MAX_AGENT_FOLDERS} folders")
        for folder in folders:
            if len(folder) > MAX_PATH:
                raise plain(f"agentFolders: a path is at most {MAX_PATH} characters")
            if not folder.startswith("/"):
                raise plain(f"agentFolders: {folder!r} is not an absolute path")
        return folders


def change_settings(current: Settings, changes: dict[str, Any]) -> Settings:
    """Applies a partial change; unknown names and bad values are refused, nothing half-applied."""
    try:
        return Settings.model_validate({**current.model_dump(mode="json"), **changes})
    except ValidationError as error:
        raise invalid(error) from None
