"""The App SDK: how an app gives the box tools.

An app is a Python package with an entry point in group `boxd.apps`, named as the app, that
names an `App`. Each tool is `<app>.<verb>` with a pydantic input model (its JSON Schema is what
`GET /tools` shows), a description, `cost(input) -> cents`, whether it always needs the owner's
OK, and the vault secrets it needs: only its own app's, `<app>.<name>` (a tool that declares
another's is refused). Tools run in the app's own runner (box-app@<app>.service), as the app's
own user, with the app's own state and secrets, never in the task nor in its broker: the task
sees only the output. A tool receives `ctx.key`, the idempotency key of the call, and must pass
it on to whatever it changes, so a call cut off and run again never does the thing twice. What
else an app may expect: docs/apps.md, "The App SDK: what an app may expect".
"""

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

Input = TypeVar("Input", bound=BaseModel)


class ToolError(Exception):
    """A failure the caller should read: its text becomes `{"ok": false, "error": ...}`."""


@dataclass(frozen=True)
class Context:
    key: str
    """The call's idempotency key: the same logical action always gets the same key."""
    task: Mapping[str, Any]
    """The task, as `GET /task` shows it."""
    secrets: Mapping[str, str]
    """Only the vault secrets this tool declared, which are its app's."""
    state_dir: Path
    """The app's own state directory (`BOX_HOME/apps/<app>`), made for it, its user's alone."""


def free(_: BaseModel) -> float:
    return 0


@dataclass(frozen=True)
class Tool(Generic[Input]):
    verb: str
    description: str
    input: type[Input]
    run: Callable[[Input, Context], Awaitable[Any]]
    cost: Callable[[Input], float] = free
    needs_ok: bool = False
    secrets: tuple[str, ...] = ()


@dataclass(frozen=True)
class App:
    name: str
    tools: tuple[Tool[Any], ...]

    def tool(self, verb: str) -> Tool[Any] | None:
        return next((tool for tool in self.tools if tool.verb == verb), None)
