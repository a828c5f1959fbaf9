import pytest

from boxd.errors import BoxError
from boxd.settings import NetworkDefault, Settings, change_settings


def test_seed_defaults() -> None:
    assert Settings().model_dump(mode="json") == {
        "defaultBudgetCents": 100,
        "defaultHosts": [],
        "networkDefault": "none",
        "agentFolders": [],
        "taskMemoryMaxBytes": 4 * 1024**3,
        "taskTasksMax": 1024,
        "taskCPUPercent": 200,
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
        (
            {"taskMemoryMaxBytes": 1000},
            "taskMemoryMaxBytes must be a whole number of bytes from 67108864 to 1099511627776",
        ),
        (
            {"taskTasksMax": 2.5},
            "taskTasksMax must be a whole number of processes from 16 to 65536",
        ),
        (
            {"taskCPUPercent": True},
            "taskCPUPercent must be a whole percentage of one core from 1 to 102400",
        ),
    ],
)
def test_bad_changes_are_refused_whole(changes: dict[str, object], message: str) -> None:
    with pytest.raises(BoxError) as caught:
        change_settings(Settings(), changes)
    assert caught.value.message.startswith(message)
