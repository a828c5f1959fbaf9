"""Who is calling the manager, as decided by polkit, a bearer token or the broker's unit."""

from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    OWNER = "owner"
    BROKER = "broker"


@dataclass(frozen=True)
class Caller:
    role: Role
    name: str
    # A broker may act for its own task only.
    task: str | None = None
