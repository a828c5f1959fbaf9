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
from boxd.task_request import budget_cents, plain


class NetworkDefault(StrEnum):
    NONE = "none"
    ALLOWLIST = "allowlist"


def _hosts(value: object) -> list[str]:
    try:
        return check_hosts(value)
    except BoxError as error:
        raise plain(error.message.replace("hosts", "defaultHosts", 1)) from None


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    defaultBudgetCents: Annotated[
        int, BeforeValidator(lambda v: budget_cents(v, "defaultBudgetCents"))
    ] = 100
    defaultHosts: Annotated[list[str], BeforeValidator(_hosts)] = []
    networkDefault: NetworkDefault = NetworkDefault.NONE
    agentFolders: list[StrictStr] = []

    @field_validator("agentFolders")
    @classmethod
    def _absolute(cls, folders: list[str]) -> list[str]:
        for folder in folders:
            if not folder.startswith("/"):
                raise plain(f"agentFolders: {folder!r} is not an absolute path")
        return folders


def change_settings(current: Settings, changes: dict[str, Any]) -> Settings:
    """Applies a partial change; unknown names and bad values are refused, nothing half-applied."""
    try:
        return Settings.model_validate({**current.model_dump(mode="json"), **changes})
    except ValidationError as error:
        raise invalid(error) from None
