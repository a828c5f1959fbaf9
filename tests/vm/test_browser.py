"""The browser harness against a real box: Debian's Chromium in the test machine logs in with
`boxctl open`'s link as the owner would; the link's code leaves the address bar, the session
is kept in the tab's sessionStorage and no cookie at all, and the page's own fetch() acts only
with the session's header."""

import re
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from boxd.web.screen_session import NO_TOKEN
from testbed.box_api import API, boxctl
from testbed.browser import (
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
from testbed.machine import Machine

LINK = re.compile(r"^(http://127\.0\.0\.1:7700/#login=\S+)$", re.MULTILINE)

# As the screen's own script does (api.js): the session from sessionStorage as the bearer.
FETCH = """
const [method, path, withSession, done] = arguments;
const headers = {};
if (withSession) headers.Authorization = "Bearer " + sessionStorage.getItem("boxd.session");
fetch(path, {method, headers}).then(
  async (answer) => done([answer.status, await answer.json()]),
  (error) => done([0, String(error)]),
);
"""


def _fetch(driver: WebDriver, method: str, path: str, *, with_session: bool = False) -> Any:
    return tuple(driver.execute_async_script(FETCH, method, path, with_session))


@pytest.mark.smoke
def test_chromium_logs_in_with_the_link_and_keeps_the_session_in_the_tab(
    machine: Machine, owner: str
) -> None:
    printed = boxctl(machine, "open", user=owner).stdout
    link = LINK.search(printed)
    assert link is not None, printed
    with browser(machine, owner) as driver:
        driver.get(link.group(1))
        WebDriverWait(driver, 60).until(
            lambda d: d.execute_script("return sessionStorage.getItem('boxd.session')")
        )
        # The code is out of the address bar (and so out of the history), and nothing is kept
        # for 127.0.0.1 that another port would be sent or could read.
        assert driver.current_url == f"{API}/"
        assert driver.get_cookies() == []
        assert driver.execute_script("return document.cookie") == ""
        kept = driver.execute_script("return sessionStorage.getItem('boxd.session')")
        assert kept.startswith("boxscreen_")

        assert _fetch(driver, "GET", "/api/pause") == (401, {"error": NO_TOKEN})
        assert _fetch(driver, "POST", "/api/pause") == (401, {"error": NO_TOKEN})
        assert _fetch(driver, "GET", "/api/pause", with_session=True) == (200, {"paused": False})
        assert _fetch(driver, "POST", "/api/pause", with_session=True) == (200, {"paused": True})
        screenshot(driver, "logged-in")
        answer = _fetch(driver, "POST", "/api/resume", with_session=True)
        assert answer == (200, {"paused": False})

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
