"""The model key a Droid task's model gateway adds: its names in the vault, and what a task is
told when there is none or the upstream refuses it. Shared by the manager, which checks for one
before a Droid task starts, and the broker, which adds it to each model request."""

from collections.abc import Iterable

# In the order the gateway prefers them: Anthropic's own key, else Factory's.
ANTHROPIC_KEY = "ANTHROPIC_API_KEY"
FACTORY_KEY = "FACTORY_API_KEY"
KEY_NAMES = (ANTHROPIC_KEY, FACTORY_KEY)

NO_KEY = (
    f"This Droid task needs a model key in the vault: add one with `boxctl vault set "
    f"{ANTHROPIC_KEY}` (or {FACTORY_KEY})."
)
KEY_REFUSED = "Your Anthropic key was not accepted. Change it in Settings, Accounts & Keys."


def missing_key(names: Iterable[str]) -> str | None:
    """Why a Droid task cannot start with a vault holding `names`, or None."""
    return None if set(KEY_NAMES) & set(names) else NO_KEY
