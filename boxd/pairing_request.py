"""The body a device sends to trade its pairing code for a token of its own (`POST /api/pair`)."""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictStr


class PairRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    code: Annotated[StrictStr, Field(max_length=100, description="The code boxctl pair showed")]
