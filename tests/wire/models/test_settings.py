import os

import pytest

from boxd.errors import BoxError
from boxd.wire.models.settings import (
    GIB,
    NetworkDefault,
    Settings,
    change_settings,
    default_all_tasks_memory,
    default_max_running_tasks,
    machine_memory_bytes,
)


def test_seed_defaults() -> None:
    defaults = Settings().model_dump(mode="json")
    memory = machine_memory_bytes()
    assert defaults.pop("allTasksMemoryMaxBytes") == memory * 3 // 4
    assert defaults.pop("allTasksTasksMax") == 16384
    assert defaults.pop("maxRunningTasks") == default_max_running_tasks(os.cpu_count() or 1, memory)
    assert defaults == {
        "defaultBudgetCents": 100,
        "defaultHosts": [],
        "networkDefault": "none",
        "agentFolders": [],
        "taskMemoryMaxBytes": 4 * 1024**3,
        "taskTasksMax": 1024,
        "taskCPUPercent": 200,
        "taskDiskQuotaBytes": None,
        "modelBaseUrl": "https://api.anthropic.com",
        "modelMaxTokens": 32_000,
    }


@pytest.mark.parametrize(
    ("cores", "gib", "running"),
    [
        (2, 4, 8),  # both allow 8
        (64, 4, 8),  # memory is the limit
        (1, 64, 4),  # cores are the limit
        (8, 0, 1),  # under a GiB of memory: still one
        (1024, 4096, 4096),  # never beyond what the setting accepts
    ],
)
def test_running_tasks_from_the_machine(cores: int, gib: int, running: int) -> None:
    assert default_max_running_tasks(cores, gib * GIB) == running


def test_all_tasks_memory_from_the_machine() -> None:
    assert default_all_tasks_memory(8 * GIB) == 6 * GIB
    assert default_all_tasks_memory(1) == 64 * 1024 * 1024


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
        ({"maxRunningTasks": 0}, "maxRunningTasks must be a whole number of tasks from 1 to 4096"),
        (
            {"allTasksTasksMax": 10},
            "allTasksTasksMax must be a whole number of processes from 16 to 4194304",
        ),
        (
            {"allTasksMemoryMaxBytes": "1G"},
            "allTasksMemoryMaxBytes must be a whole number of bytes from 67108864",
        ),
    ],
)
def test_bad_changes_are_refused_whole(changes: dict[str, object], message: str) -> None:
    with pytest.raises(BoxError) as caught:
        change_settings(Settings(), changes)
    assert caught.value.message.startswith(message)


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("https://api.anthropic.com", "https://api.anthropic.com"),
        ("https://model.test:9443/", "https://model.test:9443"),
        ("https://proxy.example/anthropic/", "https://proxy.example/anthropic"),
        ("https://[2001:db8::1]:8080", "https://[2001:db8::1]:8080"),
        # A proxy the owner runs on this machine: the key does not leave it.
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("http://127.5.0.1:8080/", "http://127.5.0.1:8080"),
        ("http://[::1]:8080", "http://[::1]:8080"),
        ("http://localhost:8080", "http://localhost:8080"),
        ("HTTP://LocalHost:8080", "HTTP://LocalHost:8080"),
        # A private address named by the owner, over TLS.
        ("https://10.0.0.5:8443", "https://10.0.0.5:8443"),
    ],
)
def test_the_model_base_url(given: str, kept: str) -> None:
    assert change_settings(Settings(), {"modelBaseUrl": given}).modelBaseUrl == kept


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("ftp://model.test", "modelBaseUrl must be an https URL like https://api.anthropic.com"),
        ("model.test", "modelBaseUrl must be an https URL like https://api.anthropic.com"),
        ("https://", "modelBaseUrl must be an https URL like https://api.anthropic.com"),
        (
            "https://model.test:99999",
            "modelBaseUrl must be an https URL like https://api.anthropic.com",
        ),
        (42, "modelBaseUrl must be an https URL like https://api.anthropic.com"),
        # The attacker's: the key in clear over a network, to anyone on the path.
        ("http://model.test:9090", "plain http is only for this machine's own loopback"),
        ("http://10.0.0.5:8080", "plain http is only for this machine's own loopback"),
        ("http://localhost.evil.test", "plain http is only for this machine's own loopback"),
        ("http://127.0.0.1.nip.io", "plain http is only for this machine's own loopback"),
        ("http://[::ffff:10.0.0.5]", "plain http is only for this machine's own loopback"),
        # Where no key belongs, over TLS or not: a cloud's metadata service, a neighbour.
        ("https://169.254.169.254", "a link-local address: the model key never goes there"),
        ("https://[fe80::1]:443", "a link-local address: the model key never goes there"),
        ("https://100.100.100.200", "metadata service"),
        ("https://224.0.0.1", "a multicast address"),
        ("https://169.254.169.254.", "a link-local address: the model key never goes there"),
        # Numbers the system's resolver reads as addresses (127.0.0.1, 10.0.0.1) that are no
        # address as ipaddress reads one, so would pass every check made on an address.
        ("https://2130706433", "is neither a name nor an address as written in a URL"),
        ("https://167772161:443", "is neither a name nor an address as written in a URL"),
        ("https://0251.0376.0251.0376", "is neither a name nor an address as written in a URL"),
        ("https://0x7f.1", "is neither a name nor an address as written in a URL"),
        ("https://127.1:8080", "is neither a name nor an address as written in a URL"),
        ("https://a b.test", "without spaces or control characters"),
        ("https://model.test\n", "without spaces or control characters"),
        ("https://" + "a" * 2000 + ".test", "modelBaseUrl is over 2,000 characters"),
        ("https://me:sk-ant-1@model.test", "modelBaseUrl must not hold a user name or password"),
        ("https://model.test/?key=1", "modelBaseUrl must not have a query or fragment"),
        ("https://model.test/#x", "modelBaseUrl must not have a query or fragment"),
    ],
)
def test_a_bad_model_base_url_is_refused_in_plain_words(given: object, words: str) -> None:
    with pytest.raises(BoxError) as refused:
        change_settings(Settings(), {"modelBaseUrl": given})
    assert words in refused.value.message
    assert "modelBaseUrl" in refused.value.message


@pytest.mark.parametrize("given", [0, -1, 128_001, 1.5, True, "32000", None])
def test_the_model_max_tokens_cap_is_a_whole_number_in_range(given: object) -> None:
    with pytest.raises(BoxError) as refused:
        change_settings(Settings(), {"modelMaxTokens": given})
    assert refused.value.message == (
        "modelMaxTokens must be a whole number of output tokens from 1 to 128000"
    )
    assert change_settings(Settings(), {"modelMaxTokens": 4096}).modelMaxTokens == 4096
