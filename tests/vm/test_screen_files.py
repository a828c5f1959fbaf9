"""A workspace as a file browser on the owner's screen, in Debian's headless Chromium against a
real box: the seed's example (a fake task writes notes.md, a real Droid task against the scripted
model summarises it into summary.md) ends with the owner opening the task, clicking summary.md,
reading it, downloading it, and `boxctl cat home:summary.md` printing it. Names with control and
bidi characters show as escapes; a file picked or dropped in the browser is uploaded into the
folder shown; a folder downloads as a tar; rename and delete go through the page's own dialogs.
Every page is saved under screenshots/."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from collections.abc import Iterator
from typing import Any

import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from testbed.box_api import boxctl, finish, http, start_fake
from testbed.browser import PHONE, browser, console_log, resize, screenshot
from testbed.machine import Machine, booted_box
from testbed.model_calls import outside_model
from testbed.model_server import ModelServer
from testbed.npm_registry import install_droid
from testbed.run_box import DEMO_TASK, DROID_TASK
from testbed.screen_driver import _click, _link, _one, _text, until

SUMMARY = (
    "# Meeting, 2 December\n"
    "- Launch moves to March.\n"
    "- Ada owns the budget.\n"
    "- Two new hires start Monday.\n"
    "- Next meeting Thursday — same room.\n"
)
DOWNLOADS = "/home/owner/Downloads"


@pytest.fixture(scope="module")
def machine() -> Iterator[Machine]:
    """A machine of this module's own, with Droid installed."""
    for m in booted_box():
        install_droid(m)
        yield m


@pytest.fixture(scope="module")
def model(machine: Machine) -> Iterator[ModelServer]:
    yield from outside_model(machine)


@pytest.fixture
def screen(machine: Machine, owner: str) -> Iterator[WebDriver]:
    """The owner's browser, logged in through `boxctl open`'s link, saving downloads to
    DOWNLOADS (emptied first)."""
    machine.run("rm", "-rf", DOWNLOADS)
    machine.run("install", "-d", "-o", owner, "-g", owner, DOWNLOADS)
    with browser(machine, owner, downloads=DOWNLOADS) as driver:
        driver.get(_link(machine, owner))
        until(driver, lambda d: _text(d, "main h1") == "Tasks")
        yield driver
        errors = [e for e in console_log(driver) if "Uncaught" in e.get("message", "")]
        assert errors == [], errors


def _turn(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"blocks": list(blocks)}


def _downloaded(machine: Machine, name: str) -> bytes:
    """The bytes Chromium saved as DOWNLOADS/name, once it has finished saving them."""
    path = f"{DOWNLOADS}/{name}"
    wait = f"until [ -f '{path}' ] && [ ! -e '{path}.crdownload' ]; do sleep 0.1; done"
    machine.run("timeout", "60", "sh", "-c", wait, timeout=70)
    # Base64 through the harness's text pipe: the file's bytes as they are, whatever they hold.
    return base64.b64decode(machine.run("base64", "-w0", path).stdout)


def _saved(machine: Machine) -> list[str]:
    """The names of the finished downloads in DOWNLOADS: not one under way (.crdownload), nor
    the file Chromium opens first and renames to that (.org.chromium.Chromium.XXXXXX)."""
    names = machine.run("ls", "-A", DOWNLOADS).stdout.splitlines()
    return [
        n for n in names if not n.endswith(".crdownload") and not n.startswith(".org.chromium.")
    ]


def _names(driver: WebDriver) -> list[str]:
    script = (
        "return [...document.querySelectorAll('tr[data-entry] td.name')].map((e) => e.innerText)"
    )
    return list(driver.execute_script(script))


def _listed_or_refused(driver: WebDriver, name: str) -> None:
    """Waits for `name` in the listing; a refusal the page showed instead fails in its words."""
    until(driver, lambda d: name in _names(d) or _text(d, ".toast.bad"), f"{name} never listed")
    assert _text(driver, ".toast.bad") == "", _text(driver, ".toast.bad")
    assert name in _names(driver)


def _open(driver: WebDriver, address: str) -> None:
    driver.execute_script("location.hash = arguments[0]", address)


@pytest.mark.smoke
def test_the_seeds_example_ends_with_summary_md_one_click_from_the_task(
    machine: Machine, screen: WebDriver, token: str, owner: str, model: ModelServer
) -> None:
    demo = start_fake(machine, token, DEMO_TASK["prompt"], title=DEMO_TASK["title"])
    assert finish(machine, demo["id"])["state"] == "done"
    model.set_script(
        [
            _turn(
                {
                    "type": "tool_use",
                    "name": "Create",
                    "input": {"file_path": "summary.md", "content": SUMMARY},
                }
            ),
            _turn({"type": "text", "text": "I wrote summary.md."}),
        ]
    )
    # A budget past what one request may cost (57 cents at most), so no turn waits for an OK.
    status, task = http(
        machine,
        "POST",
        "/api/tasks",
        token,
        json.dumps({**DROID_TASK, "model": "sonnet", "budgetCents": 200}),
    )
    assert status == 201, task
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended

    # The owner opens the task's page, and summary.md is one click away.
    _open(screen, f"#/task/{task['id']}")
    until(screen, lambda d: "done" in _text(d, "main h1 .state"))
    _one(screen, 'a[data-place="summary.md"]')
    screenshot(screen, "task-done")
    _click(screen, 'a[data-place="summary.md"]')
    until(screen, lambda d: _text(d, ".preview-text") == SUMMARY.strip(), "summary.md's text")
    assert screen.execute_script("return location.hash") == "#/file/home/summary.md"
    # Who wrote it: the Droid task, newest first, linking to its page.
    until(screen, lambda d: d.find_elements(By.CSS_SELECTOR, f'[data-history="{task["id"]}"] a'))
    screenshot(screen, "summary")

    _click(screen, "main .actions button", "Download")
    assert _downloaded(machine, "summary.md") == SUMMARY.encode()
    assert boxctl(machine, "cat", "home:summary.md", user=owner).stdout == SUMMARY

    # Its folder lists it with its size, its task, and notes.md by the demo task.
    _click(screen, ".crumbs a", "home")
    until(screen, lambda d: "summary.md" in _names(d) and "notes.md" in _names(d))
    row = _text(screen, 'tr[data-entry="summary.md"]')
    assert f"{len(SUMMARY.encode())} B" in row and str(DROID_TASK["title"]) in row, row
    assert str(DEMO_TASK["title"]) in _text(screen, 'tr[data-entry="notes.md"]')
    screenshot(screen, "home")
    # Back goes back to the file, as the address keeps the place.
    screen.back()
    until(screen, lambda d: _text(d, ".preview-text") == SUMMARY.strip())
    # And the Workspaces page opens each workspace as this browser, at a phone's width too.
    _click(screen, 'nav a[data-nav="workspaces"]')
    _click(screen, 'a[data-browse="home"]')
    until(screen, lambda d: "summary.md" in _names(d))
    resize(screen, PHONE)
    screenshot(screen, "home-phone")


def test_names_with_control_and_bidi_characters_show_as_escapes(
    machine: Machine, screen: WebDriver, token: str
) -> None:
    tricky = "invoice\u202etxt.exe"
    bell = "bell\x07\x1b[31m.txt"
    task = start_fake(
        machine, token, f"write odd/{tricky} pay me\nwrite odd/{bell} ding", title="Odd names"
    )
    assert finish(machine, task["id"])["state"] == "done"
    _open(screen, "#/files/home/odd")
    until(screen, lambda d: len(_names(d)) == 2)
    names = _names(screen)
    assert "invoice\\u202etxt.exe" in names and "bell\\x07\\x1b[31m.txt" in names, names
    # Nowhere on the page is the raw character: no text node holds it.
    raw = screen.execute_script(
        "return [...document.querySelectorAll('main *')].some((e) => [...e.childNodes]"
        ".some((n) => n.nodeType === 3 && /[\\u202e\\x07\\x1b]/.test(n.data)))"
    )
    assert raw is False
    screenshot(screen, "escaped")
    # Saved under a name that reads as it is, the override escaped (Chromium makes \ a _).
    _click(screen, 'tr[data-entry^="invoice"] button', "Download")
    saved = until(screen, lambda d: _saved(machine), "the download")
    assert len(saved) == 1 and "\u202e" not in saved[0] and "202e" in saved[0], saved
    assert _downloaded(machine, saved[0]) == b"pay me"
    _click(screen, "a.entry.file", "invoice\\u202etxt.exe")
    until(screen, lambda d: _text(d, "h1.file-name") == "invoice\\u202etxt.exe")
    until(screen, lambda d: _text(d, ".preview-text") == "pay me")


def test_a_picked_file_is_uploaded_into_the_folder_shown(
    machine: Machine, screen: WebDriver, owner: str
) -> None:
    machine.run("install", "-d", "-o", owner, "-g", owner, "/home/owner/pick")
    machine.run("sh", "-c", "printf 'from my disk\\n' > /home/owner/pick/picked.txt", user=owner)
    _open(screen, "#/files/home")
    _one(screen, "table.entries, main .empty")
    until(screen, lambda d: _text(d, "main h1") == "home")
    # Chromium reads the path in the machine, as the owner: the page gets it as picked.
    screen.find_element(By.CSS_SELECTOR, "#upload-files").send_keys("/home/owner/pick/picked.txt")
    _listed_or_refused(screen, "picked.txt")
    row = _text(screen, 'tr[data-entry="picked.txt"]')
    # By the owner's change the upload made, named by its title.
    assert "13 B" in row and "Added" in row, row
    screenshot(screen, "uploaded")
    assert boxctl(machine, "cat", "home:picked.txt", user=owner).stdout == "from my disk\n"


def test_a_dropped_file_is_uploaded_into_the_folder_shown(
    machine: Machine, screen: WebDriver, owner: str
) -> None:
    _open(screen, "#/files/home")
    until(screen, lambda d: _text(d, "main h1") == "home")
    # What Chromium's drop hands the page, made in the page: a DataTransfer holding a file.
    screen.execute_script(
        "const dt = new DataTransfer();"
        "dt.items.add(new File(['dropped here\\n'], 'dropped.txt', { type: 'text/plain' }));"
        "document.getElementById('main').dispatchEvent("
        "new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }))"
    )
    _listed_or_refused(screen, "dropped.txt")
    assert boxctl(machine, "cat", "home:dropped.txt", user=owner).stdout == "dropped here\n"


def test_a_large_text_is_cut_with_a_note_and_an_svg_is_a_picture_that_runs_nothing(
    machine: Machine, screen: WebDriver, token: str
) -> None:
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="40" height="20">'
        "<script>top.document.title = 'ran'</script>"
        '<rect width="40" height="20" fill="teal"/></svg>'
    )
    script = f"sh yes 0123456789 | head -c 300000 > big.txt\nwrite pic.svg {svg}"
    task = start_fake(machine, token, script, title="Big and pictured")
    assert finish(machine, task["id"])["state"] == "done"
    _open(screen, "#/file/home/big.txt")
    until(screen, lambda d: "Shows the first 262 kB of 300 kB" in _text(d, ".preview"))
    shown = _text(screen, ".preview-text")
    assert shown.startswith("0123456789\n") and len(shown) <= 256 * 1024, len(shown)
    _open(screen, "#/file/home/pic.svg")
    drawn = (
        "const i = document.querySelector('img.preview-image');"
        "return !!i && i.complete && i.naturalWidth"
    )
    until(screen, lambda d: d.execute_script(drawn) == 40, "the SVG drawn")
    assert screen.execute_script("return document.title") != "ran"
    assert screen.execute_script(
        "return document.querySelector('img.preview-image').src"
    ).startswith("blob:")
    screenshot(screen, "svg")


def _answer_dialog(driver: WebDriver, text: str | None = None) -> str:
    """Answers the page's confirm (OK) or prompt (with `text`); returns what it asked."""
    dialog = until(driver, lambda d: _dialog(d), "no dialog")
    asked = str(dialog.text)
    if text is not None:
        dialog.send_keys(text)
    dialog.accept()
    return asked


def _dialog(driver: WebDriver) -> Any:
    try:
        return driver.switch_to.alert
    except NoAlertPresentException:
        return None


def test_rename_and_delete_on_the_screen_are_owners_changes(
    machine: Machine, screen: WebDriver, token: str, owner: str
) -> None:
    task = start_fake(machine, token, "write keep/old.md first", title="Old file")
    assert finish(machine, task["id"])["state"] == "done"
    _open(screen, "#/files/home/keep")
    until(screen, lambda d: _names(d) == ["old.md"])
    _click(screen, 'tr[data-entry="old.md"] button', "Rename")
    assert "old.md" in _answer_dialog(screen, "new.md")
    until(screen, lambda d: _names(d) == ["new.md"], "the renamed file")
    assert boxctl(machine, "cat", "home:keep/new.md", user=owner).stdout == "first"
    _click(screen, 'tr[data-entry="new.md"] button', "Delete")
    assert "keep/new.md" in _answer_dialog(screen)
    until(screen, lambda d: _names(d) == [] and "empty" in _text(d, ".browser"))
    gone = boxctl(machine, "cat", "home:keep/new.md", user=owner, check=False)
    assert gone.returncode != 0, gone.stdout


def test_a_folder_downloads_as_a_tar_of_it_as_it_stands(
    machine: Machine, screen: WebDriver, token: str
) -> None:
    script = "write docs/a.md alpha\nwrite docs/sub/b.md beta\nwrite docs/gone.md x\n"
    task = start_fake(machine, token, script + "delete docs/gone.md", title="Docs")
    assert finish(machine, task["id"])["state"] == "done"
    _open(screen, "#/files/home/docs")
    until(screen, lambda d: sorted(_names(d)) == ["a.md", "sub/"], "the docs folder")
    _click(screen, "main .actions button", "Download this folder")
    with tarfile.open(fileobj=io.BytesIO(_downloaded(machine, "home-docs.tar"))) as tar:
        files = {
            m.name.split("docs/", 1)[-1]: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }
    assert files == {"a.md": b"alpha", "sub/b.md": b"beta"}, files


def test_a_terabyte_file_is_listed_previewed_by_its_start_and_never_held_in_the_tab(
    machine: Machine, screen: WebDriver, token: str
) -> None:
    task = start_fake(machine, token, "sh truncate -s 1T huge.bin", title="A sparse terabyte")
    assert finish(machine, task["id"])["state"] == "done"
    _open(screen, "#/files/home")
    until(screen, lambda d: "huge.bin" in _names(d))
    assert "1.1 TB" in _text(screen, 'tr[data-entry="huge.bin"]')
    _click(screen, 'tr[data-entry="huge.bin"] a.entry')
    until(screen, lambda d: "No preview" in _text(d, ".preview"))
    assert "1.1 TB (1099511627776 bytes)" in _text(screen, ".facts")
    # A browser that cannot write to a file the owner picks is told what to run instead.
    screen.execute_script("window.showSaveFilePicker = undefined")
    _click(screen, "main .actions button", "Download")
    until(screen, lambda d: "boxctl get" in _text(d, ".toast.bad"))
    assert "home:huge.bin" in _text(screen, ".toast.bad")
    screenshot(screen, "terabyte")


def test_a_folder_open_on_the_screen_shows_what_a_task_just_wrote(
    machine: Machine, screen: WebDriver, token: str
) -> None:
    _open(screen, "#/files/home/live")
    # Not there yet: the box says so, and the page waits for news of the box's tasks.
    until(screen, lambda d: _text(d, ".browser .error") != "", "the missing folder said")
    task = start_fake(machine, token, "write live/new.md fresh", title="Writes while watched")
    assert finish(machine, task["id"])["state"] == "done"
    until(screen, lambda d: _names(d) == ["new.md"], "the new file, without a reload")


def test_a_picked_folder_is_uploaded_whole_with_its_inner_folders(
    machine: Machine, screen: WebDriver, owner: str
) -> None:
    made = "mkdir -p /home/owner/album/inner && printf a > /home/owner/album/a.txt"
    machine.run("sh", "-c", made + " && printf b > /home/owner/album/inner/b.txt", user=owner)
    _open(screen, "#/files/home/photos")
    until(screen, lambda d: _text(d, "main h1") == "photos")
    # The folder input (webkitdirectory): Chromium sends each file's path under the folder.
    screen.find_element(By.CSS_SELECTOR, "#upload-folder").send_keys("/home/owner/album")
    _listed_or_refused(screen, "album/")
    assert boxctl(machine, "cat", "home:photos/album/inner/b.txt", user=owner).stdout == "b"
    assert boxctl(machine, "cat", "home:photos/album/a.txt", user=owner).stdout == "a"
