"""The owner's screen in Debian's headless Chromium, against a real box in a test machine: log
in through `boxctl open`'s link; watch a fake task's steps arrive live, approve its spend and see
it go on; undo; review and keep a personal-folder task; pause, start a task from the form, see
it queued, resume, see it run (and a first read of the pause answered after the press does not
undo it); a request without the session's header is refused; a new tab is
lent the session, and logging out ends it in every tab. Every page is saved under screenshots/
(ignored by git) for anyone to look at."""

import json
from typing import Any

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from boxd.web.screen_session import NO_TOKEN, SESSION_ENDED
from boxd.wire.caller import LINK_USED
from testbed.box_api import boxctl, finish, http, start_fake
from testbed.browser import PHONE, browser, resize, screenshot
from testbed.folders import folder, owner_token, tree  # noqa: F401
from testbed.machine import Machine
from testbed.screen_driver import (
    _click,
    _link,
    _one,
    _press,
    _text,
    until,
)
from testbed.wallet_calls import short_approval_wait  # noqa: F401

SIGNED_OUT = "Open the screen from this computer"


def _visible(driver: WebDriver, css: str) -> bool:
    script = "const e = document.querySelector(arguments[0]); return !!e && e.checkVisibility()"
    return bool(driver.execute_script(script, css))


def _state(driver: WebDriver) -> str:
    return _text(driver, "main h1 .state")


def _story(driver: WebDriver) -> list[str]:
    script = "return [...document.querySelectorAll('.story li .text')].map((e) => e.innerText)"
    return list(driver.execute_script(script))


def _not_reloaded(driver: WebDriver) -> None:
    assert driver.execute_script("return window.boxdTestMark") == "no reload"


def _api(driver: WebDriver, method: str, path: str, session: str | None) -> tuple[int, Any]:
    """A request from the page's own JavaScript, with `session` as its header if given."""
    script = """
        const [method, path, session, done] = arguments;
        const headers = session ? { Authorization: `Bearer ${session}` } : {};
        fetch(path, { method, headers }).then(async (r) => done([r.status, await r.text()]));
    """
    status, text = driver.execute_async_script(script, method, path, session)
    return status, json.loads(text) if text else None


def _session(driver: WebDriver) -> str | None:
    kept = driver.execute_script("return sessionStorage.getItem('boxd.session')")
    return None if kept is None else str(kept)


def test_a_spend_is_approved_on_the_screen_and_the_task_goes_on_live(
    machine: Machine, screen: WebDriver, token: str
) -> None:
    screenshot(screen, "tasks")
    # Started after the page loaded: it must arrive by itself.
    task = start_fake(
        machine,
        token,
        'step looking at the May bill\ncall wallet.pay {"to": "city-power", "cents": 500}\n'
        "step paid the bill",
        title="Pay the electricity bill",
        tools=["wallet.pay"],
        budgetCents=100,
    )
    _one(screen, f'[data-task="{task["id"]}"]')
    _one(screen, f'[data-approval^="{task["id"]}."]')
    card = _text(screen, f'[data-approval^="{task["id"]}."]')
    assert "wallet.pay" in card, card
    assert "$5.00" in card and "over its $1.00 budget" in card, card
    until(screen, lambda d: "waiting" in _text(d, f'[data-task="{task["id"]}"] .state'))
    screenshot(screen, "approval")
    _click(screen, f'[data-task="{task["id"]}"]')
    until(screen, lambda d: "looking at the May bill" in _story(d))
    until(screen, lambda d: _state(d) == "waiting")
    screenshot(screen, "task-waiting")
    _press(screen, "Approve", ".approval")
    until(screen, lambda d: "paid the bill" in _story(d), "the last step never arrived")
    until(screen, lambda d: _state(d) == "done")
    assert screen.find_elements(By.CSS_SELECTOR, ".approval") == []
    screenshot(screen, "task-done")
    _not_reloaded(screen)
    shown = finish(machine, task["id"])
    assert shown["state"] == "done" and shown["steps"][-1]["text"] == "paid the bill"


def test_undo_on_the_screen(machine: Machine, screen: WebDriver, token: str) -> None:
    task = start_fake(machine, token, "write undo-me.txt hello\nstep wrote it", title="Undo me")
    finish(machine, task["id"])
    screen.get(f"http://127.0.0.1:7700/#/task/{task['id']}")
    until(screen, lambda d: _state(d) == "done")
    until(screen, lambda d: "undo-me.txt" in _text(d, ".files"), "the task's files")
    screenshot(screen, "task-files")
    _press(screen, "Undo")
    until(screen, lambda d: _state(d) == "undone")
    assert http(machine, "GET", f"/api/tasks/{task['id']}", token)[1]["state"] == "undone"


def test_review_then_keep_a_personal_folder_task(
    machine: Machine,
    screen: WebDriver,
    owner: str,
    owner_token: str,  # noqa: F811
) -> None:
    real = folder(machine, owner, "screen-notes", {"a.txt": "old line\n", "b.txt": "bye\n"})
    task = start_fake(
        machine,
        owner_token,
        "write a.txt new line\nwrite added.txt hi\ndelete b.txt",
        title="Tidy my notes",
        folder=real,
    )
    assert finish(machine, task["id"])["review"] == "pending"
    screen.get(f"http://127.0.0.1:7700/#/task/{task['id']}")
    until(screen, lambda d: "Review its changes" in _text(d, "main"))
    until(screen, lambda d: _text(d, ".files"))
    files = screen.find_elements(By.CSS_SELECTOR, ".files > li")
    shown = _text(screen, ".files")
    for line in ("added.txt", "b.txt", "a.txt", "-old line", "+new line"):
        assert line in shown, shown
    assert len(files) == 3
    screenshot(screen, "review")
    # Nothing is applied until the owner keeps it.
    assert tree(machine, real) == {"a.txt": "old line", "b.txt": "bye"}
    _press(screen, "Keep changes")
    until(screen, lambda d: "kept" in _text(d, "aside"))
    assert tree(machine, real) == {"a.txt": "new line", "added.txt": "hi"}
    screenshot(screen, "kept")


def test_pause_start_from_the_form_queued_then_resume(machine: Machine, screen: WebDriver) -> None:
    _press(screen, "Pause agents")
    until(screen, lambda d: _visible(d, "#paused-banner"))
    try:
        _click(screen, 'a[href="#/new"]')
        _one(screen, "input[name=title]").send_keys("Started from the screen")
        screen.find_element(By.CSS_SELECTOR, "textarea[name=prompt]").send_keys(
            "step started from the screen"
        )
        screen.find_element(By.CSS_SELECTOR, "select[name=worker] option[value=fake]").click()
        screenshot(screen, "new-task")
        _press(screen, "Start task")
        until(screen, lambda d: "#/task/" in d.current_url)
        until(screen, lambda d: _state(d) == "queued")
        screenshot(screen, "queued")
    finally:
        _press(screen, "Resume agents")
    until(screen, lambda d: not _visible(d, "#paused-banner"))
    until(screen, lambda d: _state(d) == "done", "the queued task never ran")
    assert "started from the screen" in _story(screen)
    _not_reloaded(screen)


# The page's first read of the pause state, held until the test lets it go: as a read still on
# its way when the owner presses Pause, answered after the press.
HOLD_FIRST_PAUSE_READ = """
const realFetch = window.fetch.bind(window);
let held = false;
window.fetch = async (path, options = {}) => {
  const response = await realFetch(path, options);
  if (held || String(path) !== "/api/pause" || (options.method || "GET") !== "GET") return response;
  held = true;
  const text = await response.text();
  while (!window.boxdRelease) await new Promise((done) => setTimeout(done, 50));
  setTimeout(() => { window.boxdLateRead = "answered"; }, 300);
  return new Response(text, { status: response.status, headers: response.headers });
};
"""


def test_a_first_read_answered_after_the_owner_pressed_pause_does_not_undo_it(
    machine: Machine, owner: str
) -> None:
    with browser(machine, owner) as driver:
        driver.execute_cdp_cmd(
            "Page.addScriptToEvaluateOnNewDocument", {"source": HOLD_FIRST_PAUSE_READ}
        )
        driver.get(_link(machine, owner))
        until(driver, lambda d: _text(d, "main h1") == "Tasks")
        _press(driver, "Pause agents")
        try:
            until(driver, lambda d: _visible(d, "#paused-banner"))
            # The held read said "not paused": it was asked before the press.
            driver.execute_script("window.boxdRelease = true")
            until(driver, lambda d: d.execute_script("return window.boxdLateRead") == "answered")
            assert _visible(driver, "#paused-banner")
            assert _text(driver, "#pause") == "Resume agents"
        finally:
            boxctl(machine, "resume")


def test_the_page_acts_only_with_the_session_s_header(machine: Machine, screen: WebDriver) -> None:
    session = _session(screen)
    assert session is not None and session.startswith("boxscreen_")
    assert _api(screen, "POST", "/api/pause", None) == (401, {"error": NO_TOKEN})
    assert _api(screen, "GET", "/api/pause", None) == (401, {"error": NO_TOKEN})
    assert _api(screen, "POST", "/api/pause", session) == (200, {"paused": True})
    assert _api(screen, "POST", "/api/resume", session) == (200, {"paused": False})


def test_a_new_tab_is_lent_the_session_and_logging_out_ends_it_everywhere(
    machine: Machine, screen: WebDriver, owner: str
) -> None:
    first, session = screen.current_window_handle, _session(screen)
    screen.switch_to.new_window("tab")
    screen.get("http://127.0.0.1:7700/#/workspaces")
    until(screen, lambda d: _text(d, "main h1") == "Workspaces", "the new tab is not logged in")
    assert _session(screen) == session
    screenshot(screen, "new-tab")
    _press(screen, "Log out")
    until(screen, lambda d: _text(d, "main h1") == SIGNED_OUT)
    assert _session(screen) is None
    # The first tab let go of it too, and the box ended it.
    screen.switch_to.window(first)
    until(screen, lambda d: _text(d, "main h1") == SIGNED_OUT, "the first tab kept the session")
    assert _session(screen) is None
    assert http(machine, "GET", "/api/tasks", session) == (401, {"error": SESSION_ENDED})
    screenshot(screen, "logged-out")
    # With no tab holding a session, a new one says how to log in.
    screen.switch_to.new_window("tab")
    screen.get("http://127.0.0.1:7700/")
    until(screen, lambda d: _text(d, "main h1") == SIGNED_OUT)
    assert "not logged in" in _text(screen, "main")


def test_a_link_works_once(machine: Machine, owner: str) -> None:
    link = _link(machine, owner)
    with browser(machine, owner) as driver:
        driver.get(link)
        until(driver, lambda d: _text(d, "main h1") == "Tasks")
        driver.switch_to.new_window("tab")
        driver.get(link)
        until(driver, lambda d: _text(d, "main h1") == SIGNED_OUT)
        assert LINK_USED in _text(driver, "main")
        # The failed code is out of the address bar as well.
        assert driver.current_url == "http://127.0.0.1:7700/"
        screenshot(driver, "used-link")


def test_the_settings_and_a_phones_width(machine: Machine, screen: WebDriver) -> None:
    _click(screen, 'a[href="#/settings"]')
    until(screen, lambda d: _text(d, "main h1") == "Settings")
    # A setting that is off while null (taskDiskQuotaBytes) shows empty, and stays null when
    # another is saved.
    quota = _one(screen, "input[name=taskDiskQuotaBytes]")
    assert quota.get_attribute("value") == ""
    budget = _one(screen, "input[name=defaultBudgetCents]")
    budget.clear()
    budget.send_keys("150")
    _press(screen, "Save settings")

    def saved(driver: WebDriver) -> Any:
        shown = json.loads(boxctl(machine, "settings", "--json").stdout)
        return shown if shown["defaultBudgetCents"] == 150 else None

    assert until(screen, saved, "the settings were not saved")["taskDiskQuotaBytes"] is None
    boxctl(machine, "settings", "set", "defaultBudgetCents", "100")
    _one(screen, "input[name=device]").send_keys("anna-phone")
    _press(screen, "Make a pairing code")
    code = _one(screen, "[data-pairing-code]").text
    qr = _one(screen, ".pairing img").get_attribute("src") or ""
    assert code and qr.startswith("data:image/svg"), qr
    # Drawn, not a broken image: an SVG without its namespace would show as its alt text.
    drawn = "const i = document.querySelector('.pairing img'); return i.complete && i.naturalWidth"
    until(screen, lambda d: d.execute_script(drawn), "the QR code was not drawn")
    screenshot(screen, "settings")
    _click(screen, 'a[href="#/workspaces"]')
    until(screen, lambda d: _text(d, "main h1") == "Workspaces")
    screenshot(screen, "workspaces")
    resize(screen, PHONE)
    _click(screen, 'a[href="#/tasks"]')
    until(screen, lambda d: _text(d, "main h1") == "Tasks")
    # Nothing wider than the phone: no sideways scrolling of the page itself.
    width = screen.execute_script("return document.documentElement.scrollWidth")
    assert width <= PHONE[0], width
    screenshot(screen, "phone")


def test_a_link_with_a_broken_task_address_says_so(machine: Machine, screen: WebDriver) -> None:
    # Any page may link the owner here; a bad %-escape must not leave the screen blank (or
    # throw: the fixture fails on an uncaught error).
    screen.get("http://127.0.0.1:7700/#/task/%E0%A4")
    until(screen, lambda d: _text(d, "main .error"), "no error shown for a broken address")
    _click(screen, 'a[href="#/tasks"]')
    until(screen, lambda d: _text(d, "main h1") == "Tasks")


def test_a_review_shows_task_text_as_it_is(
    machine: Machine,
    screen: WebDriver,
    owner: str,
    owner_token: str,  # noqa: F811
) -> None:
    real = folder(machine, owner, "screen-review", {"flags.txt": "--force\nkeep\n"})
    many = "\n".join(f"write n{number}.txt line {number}" for number in range(10))
    task = start_fake(
        machine,
        owner_token,
        f"write flags.txt keep\nwrite invoice\u202etxt.exe hi\n{many}",
        title="Many files",
        folder=real,
    )
    assert finish(machine, task["id"])["review"] == "pending"
    screen.get(f"http://127.0.0.1:7700/#/task/{task['id']}")
    until(screen, lambda d: "invoice" in _text(d, ".files"), "the task's files")
    # A bidi override would show this as "invoiceexe.txt".
    assert "invoice\\u202etxt.exe" in _text(screen, ".files")
    # Twelve entries: each diff is drawn when opened, not all at once (a task can make a
    # thousand of a quarter megabyte each).
    assert screen.execute_script("return document.querySelectorAll('.files pre').length") == 0
    screen.execute_script(
        "[...document.querySelectorAll('.files summary')]"
        ".find((e) => e.textContent.includes('flags.txt')).click()"
    )
    until(screen, lambda d: _text(d, ".files pre"), "the opened diff")
    kinds = screen.execute_script(
        "return [...document.querySelectorAll('.files pre .line')]"
        ".map((e) => [e.className, e.textContent])"
    )
    assert ["line del", "---force"] in kinds, kinds


def test_a_long_story_shows_its_last_lines_and_says_how_many_more(
    machine: Machine, screen: WebDriver, token: str
) -> None:
    script = "".join(f"step line {n}\n" for n in range(1, 521))
    task = start_fake(machine, token, script, title="A long story")
    assert len(finish(machine, task["id"])["steps"]) == 520
    screen.get(f"http://127.0.0.1:7700/#/task/{task['id']}")
    until(screen, lambda d: "line 520" in _story(d))
    story = _story(screen)
    assert len(story) == 500 and story[0] == "line 21", story[:2]
    note = _text(screen, ".story li.empty")
    assert f"20 earlier steps are not shown here (boxctl show {task['id']}" in note, note
