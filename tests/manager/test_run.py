"""The manager's one way to run a command (boxd/manager/run.py)."""

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
