"""Another port of 127.0.0.1, as an attacker would use it: a local user (or an app's code in a
broker) listens on 127.0.0.1:8766 and gets the owner's logged-in Chromium to load one page.
Cookies are scoped to a host, not a port (RFC 6265 §8.5): whatever the browser keeps for
127.0.0.1 goes to that server with the request, and the page's script reads what is not
HttpOnly. The attacker then uses all of it with curl, as the owner's screen would: pair a
device (a token for good), point `modelBaseUrl` at itself, read the vault."""

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

import testbed
from boxd.web.screen_session import NO_TOKEN
from testbed.box_api import API, boxctl
from testbed.browser import browser, screenshot
from testbed.machine import Machine

ATTACKER = "mallory"
PORT = 8766
SERVER = "/run/other-port-test/other_port.py"
SEEN = f"/home/{ATTACKER}/seen.jsonl"
UNIT = "other-port-test.service"
WAIT = 60


@pytest.fixture(scope="module")
def other_port(machine: Machine) -> Iterator[str]:
    """The attacker's server, run as the attacker, on 127.0.0.1:PORT in the machine."""
    machine.run("sh", "-c", f"id {ATTACKER} >/dev/null 2>&1 || useradd -m {ATTACKER}")
    folder = machine.root / Path(SERVER).parent.relative_to("/")
    folder.mkdir(mode=0o755, exist_ok=True)
    shutil.copyfile(Path(testbed.__file__).with_name("other_port.py"), folder / "other_port.py")
    machine.run("rm", "-f", SEEN)
    machine.run(
        "systemd-run",
        f"--unit={UNIT}",
        f"--uid={ATTACKER}",
        "--property=Type=notify",
        "--property=NotifyAccess=all",
        "/usr/bin/python3",
        SERVER,
        str(PORT),
        SEEN,
    )
    try:
        yield f"http://127.0.0.1:{PORT}/"
    finally:
        machine.run("systemctl", "stop", UNIT, check=False)


def _link(machine: Machine, owner: str) -> str:
    printed = boxctl(machine, "open", user=owner).stdout
    links = [line for line in printed.splitlines() if line.startswith(f"{API}/")]
    assert len(links) == 1, printed
    return links[0]


def _until(driver: WebDriver, script: str, wanted: str) -> None:
    WebDriverWait(driver, WAIT, poll_frequency=0.1).until(
        lambda d: d.execute_script(script) == wanted, f"{script} never gave {wanted!r}"
    )


def _as_attacker(
    machine: Machine, method: str, path: str, headers: list[str], body: dict[str, Any] | None
) -> tuple[int, Any]:
    argv = ["curl", "-sS", "-X", method, "-w", "\n%{http_code}", f"{API}{path}"]
    for header in headers:
        argv += ["-H", header]
    if body is not None:
        argv += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    text = json.dumps(body) if body is not None else None
    done = machine.run(*argv, input=text, user=ATTACKER)
    answer, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(answer) if answer else None


def _cookie_values(header: str) -> dict[str, str]:
    pairs = (part.strip().partition("=") for part in header.split(";") if "=" in part)
    return {name: value for name, _, value in pairs}


def _take_over(
    machine: Machine, credentials: list[list[str]]
) -> tuple[dict[str, Any], list[tuple[int, Any]]]:
    """What the attacker gets out of each set of headers it could make from what it holds:
    the doors that opened, and the refusals."""
    gained: dict[str, Any] = {}
    refused: list[tuple[int, Any]] = []
    for headers in credentials:
        status, pairing = _as_attacker(
            machine, "POST", "/api/pairings", headers, {"name": "mallory-phone"}
        )
        if status == 201:
            paired = _as_attacker(machine, "POST", "/api/pair", [], {"code": pairing["code"]})
            gained["a paired device's token"] = paired
        else:
            refused.append((status, pairing))
        to_me = {"modelBaseUrl": f"http://127.0.0.1:{PORT}"}
        status, settings = _as_attacker(machine, "PATCH", "/api/settings", headers, to_me)
        if status == 200:
            gained["modelBaseUrl"] = settings["modelBaseUrl"]
        else:
            refused.append((status, settings))
        status, names = _as_attacker(machine, "GET", "/api/vault", headers, None)
        if status == 200:
            gained["the vault's names"] = names
        else:
            refused.append((status, names))
    return gained, refused


def test_a_page_on_another_port_gets_nothing_of_the_screens_session(
    machine: Machine, owner: str, other_port: str
) -> None:
    before = boxctl(machine, "settings", "--json").stdout
    with browser(machine, owner) as driver:
        driver.get(_link(machine, owner))
        _until(driver, "return document.querySelector('main h1')?.innerText", "Tasks")
        # The owner follows a link to a page of the attacker's, in the same tab.
        driver.get(other_port)
        _until(driver, "return document.title", "reported")
        screenshot(driver, "other-port")
        # Back in the screen's own origin, the tab still holds its session.
        driver.back()
        _until(driver, "return document.querySelector('main h1')?.innerText", "Tasks")
    seen = [
        json.loads(line) for line in machine.run("cat", SEEN, user=ATTACKER).stdout.splitlines()
    ]
    # All the attacker holds: the cookies its server was sent, and what its page could read.
    sent = [value for record in seen for name, value in record["headers"] if name == "Cookie"]
    (report,) = [json.loads(record["body"]) for record in seen if record["path"] == "/report"]
    cookies = "; ".join(filter(None, [*sent, report["cookie"]]))
    held = {**_cookie_values(cookies), **report["session"], **report["local"]}
    credentials = [[f"Cookie: {cookies}", f"X-CSRF-Token: {held.get('boxd_csrf', '')}"]]
    credentials += [[f"Authorization: Bearer {value}"] for value in held.values()]
    gained, refused = _take_over(machine, credentials)
    try:
        assert gained == {}, f"with {held}, the attacker took {gained}"
    finally:
        # Undone, should the door have opened.
        boxctl(machine, "settings", "set", "modelBaseUrl", json.loads(before)["modelBaseUrl"])
        tokens = json.loads(boxctl(machine, "token", "ls", "--json").stdout)
        for found in tokens:
            if found["name"] == "mallory-phone":
                boxctl(machine, "token", "revoke", found["id"])
    # It was sent no cookie and read none, and each request it could make is refused in words.
    assert held == {} and sent == []
    assert refused == [(401, {"error": NO_TOKEN})] * 3, refused
    assert boxctl(machine, "settings", "--json").stdout == before
