import pytest

from boxd.broker.egress.proxies import task_hosts
from boxd.net.proxy_environment import proxy_environment
from boxd.wire.models.task import Task, TaskState
from boxd.wire.models.task_request import Autonomy, DroidOptions

HOSTS = ["example.com", "*.example.org:8443"]


def public(droid: DroidOptions | None) -> dict[str, object]:
    """A task's public JSON, as the broker reads it from the manager's GetTask."""
    return Task(
        id="t000000001",
        title="t",
        prompt="p",
        state=TaskState.RUNNING,
        user="box-t000000001",
        workspace="home",
        worker="fake" if droid is None else "droid",
        tools=[],
        hosts=HOSTS,
        source="api",
        budgetCents=100,
        droid=droid,
        createdAt=0,
    ).public()


@pytest.mark.parametrize(
    ("autonomy", "expected"),
    [(Autonomy.LOW, []), (Autonomy.MEDIUM, HOSTS), (Autonomy.HIGH, HOSTS)],
)
def test_droid_autonomy(autonomy: Autonomy, expected: list[str]) -> None:
    assert task_hosts(public(DroidOptions(autonomy=autonomy))) == expected


def test_droid_settings_default_to_low_autonomy() -> None:
    assert task_hosts({"hosts": HOSTS, "droid": {"plan": True}}) == []


def test_a_task_without_droid_settings_keeps_its_hosts() -> None:
    task = public(None)
    assert "droid" not in task
    assert task_hosts(task) == HOSTS


def test_a_task_without_hosts_has_none() -> None:
    assert task_hosts({"hosts": []}) == []
    assert task_hosts({}) == []


def test_the_worker_environment_points_at_both_proxies() -> None:
    assert proxy_environment(3128, 1080) == {
        "HTTP_PROXY": "http://127.0.0.1:3128",
        "HTTPS_PROXY": "http://127.0.0.1:3128",
        "NO_PROXY": "localhost,127.0.0.1,::1",
        "http_proxy": "http://127.0.0.1:3128",
        "https_proxy": "http://127.0.0.1:3128",
        "no_proxy": "localhost,127.0.0.1,::1",
        "BOX_SOCKS_PROXY": "socks5h://127.0.0.1:1080",
        "NODE_USE_ENV_PROXY": "1",
    }


def test_no_variable_a_client_reads_by_itself_names_the_socks_proxy() -> None:
    """httpx makes a transport for every proxy variable when a client is made, and one for
    socks5h:// needs a package most installs lack (issue 36): only BOX_SOCKS_PROXY names it."""
    environment = proxy_environment(3128, 1080)
    socks = [name for name, value in environment.items() if value.startswith("socks")]
    assert socks == ["BOX_SOCKS_PROXY"]
    assert not {"ALL_PROXY", "all_proxy", "SOCKS_PROXY", "socks_proxy"} & set(environment)
