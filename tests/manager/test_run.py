"""The manager's one way to run a command (boxd/manager/run.py)."""

import asyncio
from pathlib import Path

import pytest

from boxd.manager.run import NotInstalled, complaint, run


async def test_a_command_that_succeeds_has_no_complaint() -> None:
    assert await complaint("true") is None


async def test_a_complaint_is_what_the_command_said() -> None:
    said = await complaint("sh", "-c", "echo 'no such user: box-x' >&2; exit 6")
    assert said == "no such user: box-x"


async def test_a_command_that_fails_in_silence_still_complains() -> None:
    # Before, two copies of this returned "" here, which their callers took for success.
    assert await complaint("false") == "false exited with status 1"


async def test_a_command_not_installed_is_named() -> None:
    assert await complaint("no-such-program-here", "x") == (
        "the command no-such-program-here is not installed"
    )
    with pytest.raises(NotInstalled, match="no-such-program-here"):
        await run("no-such-program-here")


async def test_input_goes_in_and_output_is_kept_only_when_asked() -> None:
    kept = await run("cat", input=b"sealed", keep_output=True)
    assert (kept.status, kept.stdout, kept.complaint) == (0, b"sealed", None)
    dropped = await run("echo", "loud")
    assert dropped.stdout == b""


async def test_env_is_added_to_the_managers_environment() -> None:
    ran = await run(
        "sh",
        "-c",
        'printf "%s %s" "$BOXD_RUN_TEST" "${PATH:+path}"',
        keep_output=True,
        env={"BOXD_RUN_TEST": "given"},
    )
    assert ran.stdout == b"given path"


async def test_a_command_cancelled_is_killed_not_left_running(tmp_path: Path) -> None:
    said = tmp_path / "pid"
    running = asyncio.create_task(run("sh", "-c", f"echo $$ > {said}; exec sleep 1000"))
    # The shell says its pid in a file; nothing else tells when it has.
    while not said.exists() or not said.read_text().endswith("\n"):  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    pid = int(said.read_text())
    running.cancel()
    ended: list[BaseException] = []
    try:
        await running
    except asyncio.CancelledError as error:
        # Kept, as whoever holds a task keeps its end: its frames keep the process's transport,
        # which, dropped at once, would kill the process anyway as Python collects it.
        ended.append(error)
    assert ended
    # Killed, it ends and asyncio reaps it; left running, this would wait for 1000 s.
    while _alive(pid):  # noqa: ASYNC110
        await asyncio.sleep(0.01)


def _alive(pid: int) -> bool:
    """Whether the process runs: neither gone nor a zombie, whose stat's third field is Z."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
