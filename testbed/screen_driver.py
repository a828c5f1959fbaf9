"""The owner's screen in a machine's browser, as VM tests drive it: the page for an owner, and
finding, reading, clicking and typing in it."""

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from testbed.box_api import boxctl
from testbed.browser import browser, console_log
from testbed.machine import Machine

LINK = re.compile(r"^(http://127\.0\.0\.1:7700/#login=\S+)$", re.MULTILINE)
WAIT = 60


def _link(machine: Machine, owner: str) -> str:
    printed = boxctl(machine, "open", user=owner).stdout
    found = LINK.search(printed)
    assert found is not None, printed
    return found.group(1)


@pytest.fixture
def screen(machine: Machine, owner: str) -> Iterator[WebDriver]:
    """The owner's browser, logged in through the link `boxctl open` printed."""
    with browser(machine, owner) as driver:
        driver.get(_link(machine, owner))
        until(driver, lambda d: d.current_url.endswith("/") or "#/" in d.current_url)
        until(driver, lambda d: _text(d, "main h1") == "Tasks")
        # Set once: still there at the end means nothing reloaded the page.
        driver.execute_script("window.boxdTestMark = 'no reload'")
        yield driver
        # A refused request is logged too (the header test makes one): only the page's own
        # errors count.
        errors = [e for e in console_log(driver) if "Uncaught" in e.get("message", "")]
        assert errors == [], errors


def until(driver: WebDriver, condition: Callable[[WebDriver], Any], what: str = "") -> Any:
    return WebDriverWait(driver, WAIT, poll_frequency=0.1).until(condition, what)


# Read in the page itself: the page redraws as events come, and an element found a moment ago
# may be gone by the time Selenium asks for its text.
def _text(driver: WebDriver, css: str) -> str:
    script = "const e = document.querySelector(arguments[0]); return e ? e.innerText.trim() : ''"
    return str(driver.execute_script(script, css))


def _one(driver: WebDriver, css: str) -> WebElement:
    found: list[WebElement] = until(
        driver, lambda d: d.find_elements(By.CSS_SELECTOR, css), f"no {css}"
    )
    return found[0]


def _click(driver: WebDriver, css: str, words: str | None = None) -> None:
    """Clicks the first visible element `css` finds (that says `words`), once it is there."""

    def click(d: WebDriver) -> bool:
        try:
            for element in d.find_elements(By.CSS_SELECTOR, css):
                if (words is None or element.text.strip() == words) and element.is_displayed():
                    element.click()
                    return True
        except StaleElementReferenceException:
            pass
        return False

    until(driver, click, f"nothing to click at {css} {words or ''}")


def _press(driver: WebDriver, words: str, within: str = "body") -> None:
    _click(driver, f"{within} button", words)
