"""Bearer tokens for the HTTP API. Only a hash is stored: tokens are long random strings, so a
plain SHA-256 is enough, and a stolen database gives no token back."""

import hashlib
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from boxd.errors import Problem, die
from boxd.wire.caller import Role
from boxd.wire.models.token_limits import DEFAULT, TokenLimits

log = logging.getLogger(__name__)

MAX_NAME = 100
# A token is shown and revoked by the start of its hash: enough to tell tokens apart, and the
# hash of a long random string gives nothing of the token away.
ID_LENGTH = 12


@dataclass(frozen=True)
class TokenRecord:
    hash: str
    name: str
    role: str
    created: float
    user: str | None
    # As stored: JSON, or None for a token made before tokens had limits.
    stored_limits: str | None = None

    @property
    def id(self) -> str:
        return self.hash[:ID_LENGTH]

    @property
    def limited(self) -> bool:
        return self.role in LIMITED_ROLES

    @property
    def limits(self) -> TokenLimits | None:
        """What its tasks may have, for an app's or a member's token; None for the others,
        which act as the owner. One made before tokens had limits, or whose limits cannot be
        read, gets the defaults: never none at all."""
        if not self.limited:
            return None
        if self.stored_limits is None:
            return DEFAULT
        try:
            return TokenLimits.model_validate_json(self.stored_limits)
        except ValidationError:
            log.error("the limits of token %s cannot be read; it gets the defaults", self.id)
            return DEFAULT

    def public(self) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "role": self.role,
            "createdAt": self.created,
        }
        if self.user:
            shown["createdBy"] = self.user
        if self.limits is not None:
            shown["limits"] = self.limits.model_dump(mode="json")
        return shown


def find_token(tokens: list[TokenRecord], wanted: str) -> TokenRecord:
    """The one token whose id, or else whose name, is `wanted`."""
    by_id = [t for t in tokens if t.id == wanted]
    if by_id:
        return by_id[0]
    by_name = [t for t in tokens if t.name == wanted]
    if len(by_name) > 1:
        ids = ", ".join(t.id for t in by_name)
        die(Problem.INVALID, f"{len(by_name)} tokens are named {wanted}: revoke one by id ({ids})")
    if not by_name:
        die(Problem.NOT_FOUND, f"no token {wanted} (boxctl token ls lists them)")
    return by_name[0]


def new_token() -> str:
    return "box_" + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_token_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > MAX_NAME:
        die(Problem.INVALID, f"a token needs a name of 1 to {MAX_NAME} characters")
    return name


# The stored role of a paired device's token, which acts as the owner's: made only by pairing.
DEVICE = "device"

# The roles a token may be made with: a broker is known by its unit, never by a token.
TOKEN_ROLES = (Role.OWNER, Role.APP, Role.MEMBER)
# The roles whose tokens carry the owner's limits; the others act as the owner.
LIMITED_ROLES = (Role.APP.value, Role.MEMBER.value)


def token_role(text: str) -> Role:
    for role in TOKEN_ROLES:
        if text == role.value:
            return role
    names = ", ".join(role.value for role in TOKEN_ROLES)
    die(Problem.INVALID, f"a token's role must be one of {names}, not {text!r}")


def check_member_id(member: str) -> str:
    """A member's id becomes the `requester` of each task they start, so it is shown as it is:
    printable, without spaces, at most MAX_NAME characters."""
    if not 0 < len(member) <= MAX_NAME or not all(
        c.isprintable() and not c.isspace() for c in member
    ):
        die(
            Problem.INVALID,
            f"a member's id must be 1 to {MAX_NAME} printable characters without spaces, "
            "such as their id in your business's own records",
        )
    return member
