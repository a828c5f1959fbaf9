"""The body of `POST /api/workspaces`."""

from pydantic import BaseModel, ConfigDict, StrictStr


class NewWorkspace(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: StrictStr
