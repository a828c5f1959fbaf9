"""The browser harness against a real box: Debian's Chromium in the test machine logs in with
`boxctl open`'s link as the owner would, the session cookie stays out of the page's reach, and
the page's own fetch() may change something only with the CSRF token."""

import re
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from boxd.web.screen_session import CSRF_COOKIE, CSRF_HEADER, NO_CSRF, SESSION_COOKIE
from tests.vm.box_api import API, boxctl
from tests.vm.browser import (
    DESKTOP,
    FORWARDER,
    PHONE,
    SCREENSHOTS,
    browser,
    current_test,
    resize,
    screenshot,
    viewport,
)
from tests.vm.machine import Machine

LINK = re.compile(r"^(http://127\.0\.0\.1:7700/login\?code=\S+)$", re.MULTILINE)

# As the screen's own script will: the CSRF token read from document.cookie, when asked for.
FETCH = """
const [method, path, cookie, header, done] = arguments;
const headers = {};
if (cookie) {
  const pair = document.cookie.split('; ').find((c) => c.startsWith(cookie + '='));
  headers[header] = pair ? pair.slice(cookie.length + 1) : '';
}
fetch(path, {method, headers}).then(
  async (answer) => done([answer.status, await answer.json()]),
  (error) => done([0, String(error)]),
);
"""


def _fetch(driver: WebDriver, method: str, path: str, *, with_token: bool = False) -> Any:
    cookie = CSRF_COOKIE if with_token else ""
    return tuple(driver.execute_async_script(FETCH, method, path, cookie, CSRF_HEADER))


def test_chromium_logs_in_with_the_link_and_keeps_the_csrf_rule(
    machine: Machine, owner: str
) -> None:
    printed = boxctl(machine, "open", user=owner).stdout
    link = LINK.search(printed)
    assert link is not None, printed
    with browser(machine, owner) as driver:
        driver.get(link.group(1))
        assert driver.current_url == f"{API}/"
        cookies = {cookie["name"]: cookie for cookie in driver.get_cookies()}
        session, csrf = cookies[SESSION_COOKIE], cookies[CSRF_COOKIE]
        assert session["httpOnly"] is True and session["sameSite"] == "Strict"
        assert csrf["httpOnly"] is False and csrf["sameSite"] == "Strict"
        # What the page's scripts see: the CSRF token, never the session.
        seen = driver.execute_script("return document.cookie").split("; ")
        assert seen == [f"{CSRF_COOKIE}={csrf['value']}"]

        assert _fetch(driver, "GET", "/api/pause") == (200, {"paused": False})
        assert _fetch(driver, "POST", "/api/pause") == (403, {"error": NO_CSRF})
        assert _fetch(driver, "GET", "/api/pause") == (200, {"paused": False})
        assert _fetch(driver, "POST", "/api/pause", with_token=True) == (200, {"paused": True})
        screenshot(driver, "logged-in")
        assert _fetch(driver, "POST", "/api/resume", with_token=True) == (200, {"paused": False})

        assert viewport(driver) == DESKTOP
        resize(driver, PHONE)
        assert viewport(driver) == PHONE
        screenshot(driver, "phone")


def _left_running(machine: Machine, owner: str) -> list[str]:
    """The owner's processes in the machine and the harness's forwarders into it."""
    inside = machine.run("ps", "-u", owner, "-o", "pid=,comm=", check=False).stdout.splitlines()
    forwarders = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(FORWARDER).encode() in argv and str(machine.leader).encode() in argv:
            forwarders.append(f"{proc.name} {b' '.join(argv).decode()}")
    return inside + forwarders


def test_chromium_is_sandboxed_and_a_failed_block_leaves_its_screen_and_nothing_running(
    machine: Machine, owner: str
) -> None:
    assert _left_running(machine, owner) == []
    with pytest.raises(AssertionError, match="on purpose"), browser(machine, owner) as driver:
        assert _left_running(machine, owner) != []
        # Its own namespaces and seccomp-bpf, without the setuid helper or --no-sandbox.
        driver.get("chrome://sandbox")
        said = driver.find_element(By.TAG_NAME, "body").text
        assert "You are adequately sandboxed." in said, said
        driver.get(f"{API}/api/openapi.json")
        driver.execute_script("console.error('seen by the harness')")
        raise AssertionError("on purpose")
    failed = SCREENSHOTS / f"{current_test()}.failed.png"
    assert failed.read_bytes().startswith(b"\x89PNG")
    assert "seen by the harness" in failed.with_suffix(".console.txt").read_text()
    assert _left_running(machine, owner) == []
