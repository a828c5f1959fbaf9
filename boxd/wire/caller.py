"""Who is calling the manager, as decided by polkit, a bearer token or the broker's unit."""

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Not at run time: brokers import this module, and import no pydantic.
    from boxd.wire.models.token_limits import TokenLimits

OWNER_ONLY = "only this computer's own screen or the owner's paired device can do this"
LINK_USED = "this link was used already or is more than a minute old: run boxctl open for a new one"
# A screen's session ends this long after its link was opened: a session left open on a desk
# does not last for good.
SCREEN_SESSION_SECONDS = 12 * 3600
# How a screen's session begins, so the gateway can say how to get a new one when it is refused.
SCREEN_SESSION_PREFIX = "boxscreen_"


class Role(StrEnum):
    OWNER = "owner"
    # An app's token: it may start and follow tasks on workspaces, not act as the owner.
    APP = "app"
    # A person a business owner made a token for: they start tasks, and see, follow and stop
    # their own (the box sets each one's `requester` to the member's id, the token's name).
    MEMBER = "member"
    # Anyone holding a pairing code, on their way to a device's token: they may only exchange it.
    PAIRING = "pairing"
    BROKER = "broker"
    # This computer's own screen: a browser session opened by `boxctl open`; it may do what the
    # owner may.
    SCREEN = "screen"
    # A one-time link from `boxctl open`, good only for exchanging itself for a screen session.
    LOGIN_LINK = "login link"
    # The owner's paired device (`boxctl pair NAME`): it may do what the screen may.
    DEVICE = "device"


@dataclass(frozen=True)
class Caller:
    role: Role
    name: str
    # A broker may act for its own task only.
    task: str | None = None
    # The Linux account behind the call (a token's is the one that made it): personal folders
    # must be in its home, and are worked on as it.
    user: str | None = None
    # Its uid, where the call itself says (D-Bus); a token's is looked up by `user`'s name.
    uid: int | None = None
    # The owner's paired device, by its name: it acts as the owner, and its tasks' source is
    # phone:<name> whatever they say.
    device: str | None = None
    # An app's or a member's token: what its tasks may have (boxd.wire.models.token_limits).
    limits: "TokenLimits | None" = None

    @property
    def acts_as_owner(self) -> bool:
        return self.role in (Role.OWNER, Role.SCREEN, Role.DEVICE)
