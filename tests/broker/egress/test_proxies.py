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
        "ALL_PROXY": "socks5h://127.0.0.1:1080",
        "NO_PROXY": "localhost,127.0.0.1,::1",
        "http_proxy": "http://127.0.0.1:3128",
        "https_proxy": "http://127.0.0.1:3128",
        "all_proxy": "socks5h://127.0.0.1:1080",
        "no_proxy": "localhost,127.0.0.1,::1",
    }
