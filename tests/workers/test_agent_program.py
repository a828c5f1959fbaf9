"""An agent's worker as a program (boxd.workers.agent_program): what boxd starts it with, its
run given that, and its failures in words on stderr with exit status 1."""

from pathlib import Path

import pytest

from boxd.workers.agent_program import run_agent_worker
from boxd.workers.broker_client import BrokerGone


class Failed(Exception):
    pass


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("BOX_SOCKET", "/run/box/t1/broker.sock")
    monkeypatch.setenv("BOX_MODEL_URL", "http://127.0.0.1:3130")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_run_gets_the_socket_home_workspace_and_gateway(started: Path) -> None:
    given = []

    async def run(socket_path: str, home: Path, work_dir: Path, gateway_url: str) -> None:
        given.append((socket_path, home, work_dir, gateway_url))

    run_agent_worker("claude", run, Failed)
    assert given == [
        ("/run/box/t1/broker.sock", started / "home", started, "http://127.0.0.1:3130")
    ]


@pytest.mark.parametrize("missing", ["BOX_SOCKET", "BOX_MODEL_URL", "HOME"])
def test_a_worker_started_without_its_environment_says_so_and_runs_nothing(
    started: Path, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    monkeypatch.delenv(missing)
    ran = []

    async def run(socket_path: str, home: Path, work_dir: Path, gateway_url: str) -> None:
        ran.append(True)

    with pytest.raises(SystemExit) as exited:
        run_agent_worker("droid", run, Failed)
    assert exited.value.code == (
        "droid worker: BOX_SOCKET, BOX_MODEL_URL and HOME must be set; "
        "boxd starts this worker for a task"
    )
    assert ran == []


@pytest.mark.parametrize(
    "failure", [Failed("Droid stopped: no model"), BrokerGone("the broker went away")]
)
def test_a_failure_is_printed_for_the_task_s_log_and_exits_1(
    started: Path, capsys: pytest.CaptureFixture[str], failure: Exception
) -> None:
    async def run(socket_path: str, home: Path, work_dir: Path, gateway_url: str) -> None:
        raise failure

    with pytest.raises(SystemExit) as exited:
        run_agent_worker("droid", run, Failed)
    assert exited.value.code == 1
    assert capsys.readouterr().err == f"{failure}\n"


def test_an_unforeseen_error_is_left_to_python_with_its_traceback(started: Path) -> None:
    async def run(socket_path: str, home: Path, work_dir: Path, gateway_url: str) -> None:
        raise ValueError("a bug, with its traceback")

    with pytest.raises(ValueError):
        run_agent_worker("claude", run, Failed)
