"""The bodies of the owner's settings, vault and pairing routes (`PATCH /api/settings`,
`PUT /api/vault/{name}`, `POST /api/pairings`). The manager checks what they say, in the same
words for every door; these check only their shape."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel, StrictStr

from boxd.settings import Settings


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
