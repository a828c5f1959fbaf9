"""The Claude models a Droid task may name, and the full id each short name stands for."""

import re

from boxd.errors import Problem, die

ALIASES = {
    "haiku": "claude-haiku-4-5",
    "sonnet": "claude-sonnet-4-6",
    "opus": "claude-opus-4-6",
}
DEFAULT_MODEL = "sonnet"
_FULL_ID = re.compile(r"claude-[a-z0-9][a-z0-9.-]{0,98}")


def resolve_model(name: str) -> str:
    if name in ALIASES:
        return ALIASES[name]
    if _FULL_ID.fullmatch(name):
        return name
    die(
        Problem.INVALID,
        f"model: unknown model {name!r}; "
        "use haiku, sonnet, opus or a full id like claude-sonnet-4-6",
    )
