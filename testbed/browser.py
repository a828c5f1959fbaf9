"""Debian's Chromium, headless inside a test machine, driven from the host with Selenium.

    with browser(machine, owner) as driver:
        driver.get(link)
        screenshot(driver, "tasks")

Debian's chromedriver runs inside the machine as the given Linux user, in a transient systemd
unit of its own (so stopping the unit ends Chromium's every process), and starts Debian's
/usr/bin/chromium. Chromium gets its own sandbox, never --no-sandbox: nspawn lets an
unprivileged user make user namespaces, so its zygote puts renderers in new user, PID and
network namespaces under its seccomp-bpf filter, inside the machine's own seccomp filter and
capability bounding set (the unit runs under the machine's systemd, not the harness's nsenter).

A machine with --private-network has a loopback of its own, so chromedriver's port is reached
through port_forward.py: a socket listening on the host's 127.0.0.1 is handed to a forwarder
run in the machine's network namespace, which connects onward to chromedriver there. Selenium
only ever talks to that remote chromedriver: it never runs Selenium Manager, never downloads a
driver or a browser.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.proxy import Proxy, ProxyType
from selenium.webdriver.remote.client_config import ClientConfig
from selenium.webdriver.remote.command import Command
from selenium.webdriver.remote.webdriver import WebDriver

from .image import REPO_ROOT
from .machine import Machine, MachineError

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FORWARDER = Path(__file__).resolve().with_name("port_forward.py")
# Ignored by git (.gitignore): pictures of the screen for anyone to look at after a run.
SCREENSHOTS = REPO_ROOT / "screenshots"

DESKTOP = (1280, 900)
# A phone's width: an iPhone 12 to 15's viewport in CSS pixels.
PHONE = (390, 844)

READY_TIMEOUT = 30.0
# Straight to the forwarder, whatever http_proxy the harness's environment names.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# Generous for a loaded 2-core machine; a command that takes longer has hung.
COMMAND_TIMEOUT = 120
# The unit ends by itself after this, should a harness die without stopping it.
UNIT_LIFETIME = "30min"


class BrowserError(MachineError):
    pass


def log(message: str) -> None:
    print(f"[boxd-test browser] {message}", file=sys.stderr, flush=True)


def current_test() -> str:
    """The running test's name, as a file name: test_browser.test_x[param]."""
    running = os.environ.get("PYTEST_CURRENT_TEST", "no-test").split(" ")[0]
    module, _, test = running.rpartition("::")
    name = f"{Path(module).stem}.{test}" if module else test
    return re.sub(r"[^A-Za-z0-9_.\-\[\]]+", "_", name)


def screenshot(driver: WebDriver, name: str) -> Path:
    """Save what the browser shows now as screenshots/<test>.<name>.png; return its path."""
    SCREENSHOTS.mkdir(exist_ok=True)
    path = SCREENSHOTS / f"{current_test()}.{name}.png"
    if not driver.save_screenshot(str(path)):
        raise BrowserError(f"Chromium took no screenshot for {path}")
    return path


def console_log(driver: WebDriver) -> list[dict[str, Any]]:
    """What the page's scripts logged and the errors Chromium reported, oldest first."""
    entries: list[dict[str, Any]] = driver.execute(Command.GET_LOG, {"type": "browser"})["value"]
    return entries


def viewport(driver: WebDriver) -> tuple[int, int]:
    width, height = driver.execute_script("return [innerWidth, innerHeight]")
    return int(width), int(height)


def resize(driver: WebDriver, size: tuple[int, int]) -> None:
    """Make the page's viewport `size` CSS pixels, e.g. PHONE or DESKTOP."""
    # WebDriver sizes the window, which headless Chromium keeps taller than its viewport
    # (by 143 px in Chromium 150): size it once, then again by what it lacked.
    driver.set_window_size(*size)
    width, height = viewport(driver)
    if (width, height) != size:
        driver.set_window_size(2 * size[0] - width, 2 * size[1] - height)
    if viewport(driver) != size:
        raise BrowserError(f"Chromium's viewport is {viewport(driver)}, not {size} as asked")


def _save_failure(driver: WebDriver) -> None:
    # Best effort: the test has failed already, and its own error is what matters.
    try:
        path = screenshot(driver, "failed")
        lines = [json.dumps(entry) for entry in console_log(driver)]
        path.with_suffix(".console.txt").write_text("\n".join(lines) + "\n")
        log(f"the failing test's screen: {path}; its console: {path.with_suffix('.console.txt')}")
    except (WebDriverException, OSError) as e:
        log(f"could not save the failing test's screen: {e}")


def _unit_state(machine: Machine, unit: str) -> str:
    return machine.run("systemctl", "is-active", unit, check=False).stdout.strip()


def _unit_journal(machine: Machine, unit: str) -> str:
    done = machine.run("journalctl", "--no-pager", "-n", "40", "-u", unit, check=False)
    return done.stdout + done.stderr


def _wait_ready(machine: Machine, unit: str, url: str, forwarder: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    said = ""
    while time.monotonic() < deadline:
        if forwarder.poll() is not None:
            raise BrowserError(f"the port forwarder exited with status {forwarder.returncode}")
        try:
            with DIRECT.open(f"{url}/status", timeout=2) as answer:
                if json.load(answer)["value"]["ready"]:
                    return
        except (OSError, ValueError, KeyError) as e:
            said = str(e)
        if _unit_state(machine, unit) not in ("active", "activating"):
            break
        # chromedriver is a process in another machine: there is nothing to wait on but its port.
        time.sleep(0.05)
    raise BrowserError(
        f"chromedriver ({unit}) was not ready within {READY_TIMEOUT:g} s (last: {said}). "
        f"Its journal:\n{_unit_journal(machine, unit)}"
    )


def _options(size: tuple[int, int], downloads: str | None) -> webdriver.ChromeOptions:
    options = webdriver.ChromeOptions()
    if downloads is not None:
        # Saved there without asking, as a test reads what the page handed the browser.
        prefs = {"download.default_directory": downloads, "download.prompt_for_download": False}
        options.add_experimental_option("prefs", prefs)
    options.binary_location = CHROMIUM
    options.add_argument("--headless=new")
    options.add_argument(f"--window-size={size[0]},{size[1]}")
    # chromedriver speaks to Chromium over a pipe, not a DevTools port on the machine's
    # loopback, which every local user there (task users too) could connect to and drive the
    # owner's logged-in browser with; and the image has no /etc/hosts, so the port's
    # ws://localhost address would not resolve anyway.
    options.add_argument("--remote-debugging-pipe")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return options


def _forwarder(machine: Machine, port: int) -> tuple[subprocess.Popen[bytes], int]:
    """A forwarder from a new port on the host's 127.0.0.1 to `port` in the machine."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        fd = listener.fileno()
        # Dies with the harness (SIGKILL included) rather than outlive it; nsenter -n execs
        # without forking, so the death signal holds for the forwarder itself.
        forwarder = subprocess.Popen(
            [
                *("setpriv", "--pdeathsig", "KILL", "--"),
                *("nsenter", "-t", str(machine.leader), "-n"),
                *(sys.executable, str(FORWARDER), str(fd), str(port)),
            ],
            stdin=subprocess.DEVNULL,
            pass_fds=(fd,),
            start_new_session=True,
        )
        # The forwarder holds its own copy; this one closes with the with block.
        return forwarder, listener.getsockname()[1]


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.kill()
    process.wait(10)


@contextlib.contextmanager
def browser(
    machine: Machine, user: str, *, size: tuple[int, int] = DESKTOP, downloads: str | None = None
) -> Iterator[WebDriver]:
    """A headless Chromium in `machine`, run as the Linux user `user`, its viewport `size`;
    what it downloads goes to the folder `downloads` in the machine, if given.

    Everything ends with the block, whatever happens in it; a failure in the block leaves
    screenshots/<test>.failed.png and the browser's console beside it.
    """
    started = time.monotonic()
    unit = f"boxd-test-chromedriver-{secrets.token_hex(4)}"
    # The machine's loopback is its own: nothing listens this high there but other browsers.
    # Below the kernel's ephemeral ports (32768 and up), which the machine's own connections
    # (Chromium's to the box, say) take: a port among them was once in use, and chromedriver
    # could not bind it.
    port = 20000 + secrets.randbelow(12000)
    machine.run(
        "systemd-run",
        "--quiet",
        "--collect",
        f"--unit={unit}",
        f"--uid={user}",
        f"--property=RuntimeMaxSec={UNIT_LIFETIME}",
        CHROMEDRIVER,
        f"--port={port}",
    )
    forwarder: subprocess.Popen[bytes] | None = None
    driver: WebDriver | None = None
    try:
        forwarder, host_port = _forwarder(machine, port)
        url = f"http://127.0.0.1:{host_port}"
        _wait_ready(machine, unit, url, forwarder)
        # DIRECT: an http_proxy in the harness's environment must not get the driver's calls.
        config = ClientConfig(
            remote_server_addr=url,
            proxy=Proxy({"proxyType": ProxyType.DIRECT}),
            timeout=COMMAND_TIMEOUT,
        )
        driver = webdriver.Remote(url, options=_options(size, downloads), client_config=config)
        resize(driver, size)
        log(f"Chromium ready in {time.monotonic() - started:.2f} s ({unit}, as {user})")
        try:
            yield driver
        except BaseException:
            _save_failure(driver)
            raise
    finally:
        if driver is not None:
            with contextlib.suppress(WebDriverException, OSError):
                driver.quit()
        if forwarder is not None:
            _stop(forwarder)
        # Stopping the unit ends chromedriver and every Chromium process in its cgroup.
        if machine.running:
            machine.run("systemctl", "stop", unit, check=False)
