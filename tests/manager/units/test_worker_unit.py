"""The worker unit's properties marshal as the D-Bus types systemd declares; the real check,
StartTransientUnit accepting them, is in tests/vm/test_sandbox.py."""

from pathlib import Path

from dbus_fast import Message

from boxd.broker.main import MODEL_GATEWAY
from boxd.manager.units.netns import MODEL_GATEWAY_PORT
from boxd.manager.units.worker_unit import (
    AHEAD_MODULE,
    ahead_worker_properties,
    model_socket_unit,
    wake_signal,
    worker_properties,
)
from boxd.wire.models.settings import Settings
from boxd.wire.models.task import Task, TaskState
from boxd.wire.worker_kinds import WORKERS


def _task() -> Task:
    return Task(
        id="t000000001",
        title="a task",
        prompt="step hi",
        state=TaskState.QUEUED,
        user="box-t000000001",
        workspace="home",
        worker="fake",
        tools=[],
        hosts=[],
        source="api",
        budgetCents=100,
        createdAt=0.0,
    )


def test_properties_marshal_as_start_transient_unit_wants() -> None:
    settings = Settings(taskMemoryMaxBytes=2**30, taskTasksMax=64, taskCPUPercent=50)
    properties = worker_properties(Path("/var/lib/box"), _task(), settings)
    message = Message(
        destination="org.freedesktop.systemd1",
        path="/org/freedesktop/systemd1",
        interface="org.freedesktop.systemd1.Manager",
        member="StartTransientUnit",
        signature="ssa(sv)a(sa(sv))",
        body=["box-task-t000000001.service", "fail", [list(p) for p in properties], []],
    )
    assert message._marshall(negotiate_unix_fd=False)
    values = {name: variant.value for name, variant in properties}
    assert values["NetworkNamespacePath"] == "/run/netns/box-t000000001"
    assert values["MemoryMax"] == 2**30
    assert values["TasksMax"] == 64
    assert values["CPUQuotaPerSecUSec"] == 500_000
    # Ten minutes to start, not systemd's 90 s: a box busy starting many tasks kept its own.
    assert values["TimeoutStartUSec"] == 600_000_000
    assert values["TemporaryFileSystem"] == [
        ["/var/lib/box", "mode=0755"],
        ["/run", "mode=0755"],
        ["/dev/shm", "mode=1777,nosuid,nodev"],
        ["/run/lock", "mode=1777,nosuid,nodev"],
    ]
    work = "/var/lib/box/tasks/t000000001/work"
    home = "/var/lib/box/tasks/t000000001/home"
    door = "/var/lib/box/tasks/t000000001/broker.sock"
    assert values["BindPaths"] == [
        [work, work, False, 16384],
        [home, home, False, 0],
        [door, door, False, 0],
    ]
    assert len({name for name, _ in properties}) == len(properties)


def test_the_worker_is_pointed_at_its_proxies_in_both_cases() -> None:
    properties = dict(worker_properties(Path("/var/lib/box"), _task(), Settings()))
    assert properties["Environment"].value[-8:] == [
        "HTTP_PROXY=http://127.0.0.1:3128",
        "HTTPS_PROXY=http://127.0.0.1:3128",
        "NO_PROXY=localhost,127.0.0.1,::1",
        "http_proxy=http://127.0.0.1:3128",
        "https_proxy=http://127.0.0.1:3128",
        "no_proxy=localhost,127.0.0.1,::1",
        "BOX_SOCKS_PROXY=socks5h://127.0.0.1:1080",
        "NODE_USE_ENV_PROXY=1",
    ]


def test_the_worker_reaches_its_model_through_the_gateway_and_holds_no_key() -> None:
    environment = worker_properties(Path("/var/lib/box"), _task(), Settings())
    values = dict(environment)["Environment"].value
    assert "BOX_MODEL_URL=http://127.0.0.1:3130" in values
    assert not [e for e in values if "KEY" in e.partition("=")[0]]


def test_the_model_gateway_socket_is_bound_where_the_worker_looks() -> None:
    """units/box-model@.socket binds the port BOX_MODEL_URL names, in the task's namespace, and
    hands it to the broker under the name the broker serves the gateway on."""
    unit = (Path(__file__).parents[3] / "units/box-model@.socket").read_text().splitlines()
    assert f"ListenStream=127.0.0.1:{MODEL_GATEWAY_PORT}" in unit
    assert f"FileDescriptorName={MODEL_GATEWAY}" in unit
    assert "NetworkNamespacePath=/run/netns/box-%i" in unit
    assert model_socket_unit("t000000001") == "box-model@t000000001.socket"
    broker = (Path(__file__).parents[3] / "units/box-broker@.service").read_text()
    assert "box-model@%i.socket" in broker.split("Sockets=", 1)[1].splitlines()[0]


def test_the_worker_starts_isolated_with_a_home_of_its_own() -> None:
    properties = dict(worker_properties(Path("/var/lib/box"), _task(), Settings()))
    argv = properties["ExecStart"].value[0][1]
    # -I: nothing from the environment, the user's site-packages or the working directory.
    assert argv[1:] == ["-I", "-u", "-m", "boxd.workers.fake"]
    environment = properties["Environment"].value
    home = "/var/lib/box/tasks/t000000001/home"
    assert f"HOME={home}" in environment
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        (value,) = [e.partition("=")[2] for e in environment if e.startswith(f"{name}=")]
        assert value.startswith(f"{home}/"), name
    work = properties["WorkingDirectory"].value
    assert not any(e.partition("=")[2].startswith(work) for e in environment)


def test_the_worker_starts_with_its_broker_in_one_job_and_after_the_sockets() -> None:
    """One StartTransientUnit starts all six units: the worker wants its broker and the broker's
    sockets, and is ordered after the sockets, so its first connection finds them listening. It
    is not ordered after the broker, whose start-up overlaps its own, and does not require it: a
    broker restarted after a crash must not take the worker down with it."""
    properties = dict(worker_properties(Path("/var/lib/box"), _task(), Settings()))
    sockets = [
        "box-broker@t000000001.socket",
        "box-egress-http@t000000001.socket",
        "box-egress-socks@t000000001.socket",
        "box-model@t000000001.socket",
    ]
    assert properties["Wants"].value == [*sockets, "box-broker@t000000001.service"]
    assert properties["After"].value == sockets
    assert "Requires" not in properties and "BindsTo" not in properties
    # The sockets the broker's unit serves are the ones the worker waits for.
    broker = (Path(__file__).parents[3] / "units/box-broker@.service").read_text()
    served = broker.split("Sockets=", 1)[1].splitlines()[0].split()
    assert [name.replace("%i", "t000000001") for name in served] == sockets


def test_a_worker_started_ahead_gets_a_tasks_unit_but_for_its_program() -> None:
    # A task that takes a spare runs in the unit it would have had without one: same sandbox,
    # user, slice, environment and working directory, for either worker.
    home, settings = Path("/var/lib/box"), Settings()
    ahead = dict(ahead_worker_properties(home, "t000000001", settings))
    for worker in ("fake", "droid"):
        task = _task().model_copy(update={"worker": worker})
        own = dict(worker_properties(home, task, settings))
        assert ahead.keys() == own.keys()
        differ = [name for name in own if own[name] != ahead[name]]
        assert differ == ["ExecStart"]
        program = ahead["ExecStart"].value[0][1]
        assert program[:-1] == own["ExecStart"].value[0][1][:-1]
        assert program[-1] == AHEAD_MODULE
        assert wake_signal(task) == WORKERS[worker].wake
