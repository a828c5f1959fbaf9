"""This computer's own screen: `boxctl open` asks for a one-time link, and the browser that
follows it within a minute gets a session.

A link lives in memory only: it is good for a minute, so a restart that forgets it costs the
owner one more `boxctl open`. A session is kept as tokens are, its hash only, with the role
`screen`: it is listed and revoked with the tokens, and its next request after a revoke is 401.
It ends SCREEN_SESSION_SECONDS after it was opened, or when the screen logs out: its next
request is 401 and it is removed.
"""

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from boxd.errors import Problem, die
from boxd.manager.access.tokens import TokenRecord, token_hash
from boxd.manager.record.store import Store
from boxd.wire.caller import LINK_USED, SCREEN_SESSION_PREFIX, SCREEN_SESSION_SECONDS, Caller, Role

LINK_SECONDS = 60
LINK_PREFIX = "boxlink_"
# The name a session is kept under. Sessions kept under another ("screen") were handed out as
# cookies, which went to every port of 127.0.0.1 (issue 32): they may be another's, and end.
SESSION_NAME = "screen session"


@dataclass(frozen=True)
class _Link:
    user: str | None
    expires: float


def _secret(prefix: str) -> str:
    # As much randomness as a token's: a link or a session is as good as one while it lasts.
    return prefix + secrets.token_urlsafe(32)


class ScreenSessions:
    def __init__(
        self,
        store: Store,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._clock = clock
        # Sessions outlive restarts, so their age is told by the wall clock they were made by.
        self._wall = wall
        # By the hash of the link's code: a link is never kept as it was handed out.
        self._links: dict[str, _Link] = {}

    def link_caller(self, code: str) -> Caller | None:
        """The caller a live link's code stands for; the link is taken only by opening it."""
        hashed = token_hash(code)
        link = self._links.get(hashed)
        if link is None or link.expires <= self._clock():
            return None
        return Caller(Role.LOGIN_LINK, hashed, user=link.user)

    async def create_link(self, caller: Caller) -> dict[str, Any]:
        self._forget_expired()
        code = _secret(LINK_PREFIX)
        self._links[token_hash(code)] = _Link(caller.user, self._clock() + LINK_SECONDS)
        return {"code": code, "expiresInSeconds": LINK_SECONDS}

    async def open_session(self, caller: Caller) -> dict[str, Any]:
        # Taken before anything is awaited: of two callers with the same link, one gets it.
        link = self._links.pop(caller.name, None)
        if link is None or link.expires <= self._clock():
            die(Problem.UNAUTHORIZED, LINK_USED)
        session = _secret(SCREEN_SESSION_PREFIX)
        await self._store.add_token(token_hash(session), SESSION_NAME, Role.SCREEN.value, link.user)
        return {"session": session}

    async def close_session(self, caller: Caller, session: str) -> dict[str, Any]:
        """A screen logging out: the session it names (its own, as the gateway passes it) ends."""
        hashed = token_hash(session)
        found = await self._store.token(hashed)
        if found is None or found.role != Role.SCREEN.value:
            die(Problem.NOT_FOUND, "no such screen's session: it has ended already")
        await self._store.remove_token(hashed)
        return {"ended": True}

    async def refuse_if_over(self, session: TokenRecord) -> None:
        """A session past its time, or handed out as a cookie, is removed, and its caller told
        as a revoked one is."""
        if session.name == SESSION_NAME and self._wall() - session.created < SCREEN_SESSION_SECONDS:
            return
        await self._store.remove_token(session.hash)
        die(Problem.UNAUTHORIZED, "this screen's session is over: run boxctl open for a new one")

    def _forget_expired(self) -> None:
        now = self._clock()
        for hashed in [h for h, link in self._links.items() if link.expires <= now]:
            del self._links[hashed]
