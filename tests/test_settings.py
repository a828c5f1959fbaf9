import pytest

from boxd.errors import BoxError
from boxd.settings import NetworkDefault, Settings, change_settings


def test_seed_defaults() -> None:
    assert Settings().model_dump(mode="json") == {
        "defaultBudgetCents": 100,
        "defaultHosts": [],
        "networkDefault": "none",
        "agentFolders": [],
    }


def test_change_keeps_the_rest() -> None:
    changed = change_settings(Settings(), {"networkDefault": "allowlist"})
    assert changed.networkDefault == NetworkDefault.ALLOWLIST
    assert changed.defaultBudgetCents == 100


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"defaultBudgetCents": -5}, "defaultBudgetCents must be a whole number from 0 to 100000"),
        ({"defaultHosts": ["localhost"]}, "defaultHosts: 'localhost' is the box itself"),
        ({"networkDefault": "open"}, "networkDefault: input should be 'none' or 'allowlist'"),
        ({"agentFolders": ["notes"]}, "agentFolders: 'notes' is not an absolute path"),
        ({"colour": "red"}, "unknown field colour"),
    ],
)
def test_bad_changes_are_refused_whole(changes: dict[str, object], message: str) -> None:
    with pytest.raises(BoxError) as caught:
        change_settings(Settings(), changes)
    assert caught.value.message.startswith(message)
