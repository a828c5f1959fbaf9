"""The bodies of the owner's settings, vault, pairing, token and workspace routes (`PATCH
/api/settings`, `PUT /api/vault/{name}`, `POST /api/pairings`, `POST /api/tokens`, `POST
/api/workspaces`), and the one a device sends to trade its pairing code for a token of its own
(`POST /api/pair`). The manager checks what they say, in the same words for every door; these
check only their shape."""

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, RootModel, StrictStr

from boxd.wire.models.settings import Settings
from boxd.wire.models.token_limits import TokenLimits


class SettingsChanges(RootModel[dict[str, Any]]):
    """Some of the settings with new values; the others stay as they are."""

    model_config = ConfigDict(
        json_schema_extra={
            "description": "Any of the settings (see Settings), with their new values",
            "propertyNames": {"enum": list(Settings.model_fields)},
        }
    )


class SecretValue(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    value: StrictStr = Field(description="The secret; it goes into the vault and never comes out")


class NewPairing(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: StrictStr = Field(description="The device's name: its tasks' source is phone:<name>")


class PairRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    code: Annotated[StrictStr, Field(max_length=100, description="The code boxctl pair showed")]


class NewToken(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: StrictStr = Field(description="What it is for; a member's token: the member's id")
    role: StrictStr = Field(description="owner, app or member")
    limits: TokenLimits | None = Field(
        default=None,
        description="An app's or a member's: what its tasks may have; left out, the defaults",
    )

    def limits_json(self) -> str:
        """The limits as the manager reads them: only the fields the owner named."""
        return "" if self.limits is None else self.limits.model_dump_json(exclude_unset=True)


class NewWorkspace(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: StrictStr


# POST /api/workspaces/{name}/rename: a path in the workspace and its new one. (Not a docstring:
# the OpenAPI document shows one, and boxd runs without docstrings.)
class RenameRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    from_: StrictStr = Field(alias="from", description="A path in the workspace, like docs/a.md")
    to: StrictStr = Field(description="Its new path; a folder on the way is made")
