"""The model key the gateway adds to each request upstream: the vault's, as systemd gave it to
this broker, and never shown (not in a repr, a log line or an error)."""

import re
from dataclasses import dataclass, field

from boxd.errors import BoxError, Problem
from boxd.wire.credentials import read_secrets
from boxd.wire.model_key import ANTHROPIC_KEY, KEY_NAMES

# What a key is made of: printable ASCII, no spaces. Anything else could not go in a header
# (and aiohttp's complaint would not be in the owner's words).
_KEY_CHARACTERS = re.compile(r"[!-~]+")


@dataclass(frozen=True)
class ModelKey:
    name: str
    # Never shown: not in a repr, a log line or an error.
    value: str = field(repr=False)

    def headers(self) -> dict[str, str]:
        """Anthropic's API reads x-api-key; a Factory key also goes as a bearer token, the way
        Factory's own endpoints take it."""
        if self.name == ANTHROPIC_KEY:
            return {"x-api-key": self.value}
        return {"x-api-key": self.value, "authorization": f"Bearer {self.value}"}


def vault_model_key() -> ModelKey | None:
    """The first of the model keys the vault holds, as systemd gave them to this broker."""
    secrets_found = read_secrets(KEY_NAMES)
    for name in KEY_NAMES:
        if secrets_found.get(name):
            return ModelKey(name, secrets_found[name].strip())
    return None


def usable(key: ModelKey | None) -> ModelKey:
    """The key, if there is one and it could be a key; else why not, in the owner's words."""
    if key is None:
        raise BoxError(
            Problem.UNAUTHORIZED,
            f"this box has no model key: the owner adds one with `boxctl vault set "
            f"{ANTHROPIC_KEY}`",
        )
    if not _KEY_CHARACTERS.fullmatch(key.value):
        raise BoxError(
            Problem.UNAUTHORIZED,
            f"the vault's {key.name} is not a key: it holds spaces, line breaks or "
            f"other characters no key has; the owner sets it again with `boxctl vault set "
            f"{key.name}`",
        )
    return key
