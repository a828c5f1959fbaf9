"""`boxctl open`: a one-time link to this computer's own screen, opened in the owner's browser
where there is a desktop, printed otherwise. Its code is after `#`: the browser never sends it
to any server, and the page takes it out of the address bar before it trades it for a session
(boxd.web.screen_session; the link: boxd.wire.screen_link)."""

import asyncio
import html
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from boxd.dbus import interface as api
from boxd.dbus.client import BoxClient
from boxd.wire.screen_link import login_link


def _browser() -> str | None:
    """xdg-open, when there is a desktop session for it to open a browser in."""
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return None
    return shutil.which("xdg-open")


def redirect_page(url: str) -> Path:
    """A page, readable by this account alone, that sends the browser on to `url`. The browser
    is given the page's path, never the link itself: a command line is in /proc for every
    local user to read, and the link's code is worth a session as the owner until it is used."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    folder = Path(runtime) if runtime and os.path.isdir(runtime) else Path(tempfile.mkdtemp())
    page = folder / "boxd-open.html"
    escaped = html.escape(url, quote=True)
    text = (
        '<!doctype html><meta charset="utf-8"><meta name="referrer" content="no-referrer">'
        f'<meta http-equiv="refresh" content="0;url={escaped}"><a href="{escaped}">Open the box</a>'
    )
    fd = os.open(page, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
    return page


def _launch(opener: str, url: str) -> bool:
    # Not waited for: some browsers keep xdg-open until they close.
    try:
        page = redirect_page(url)
        subprocess.Popen(
            [opener, str(page)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return False
    return True


async def open_screen(client: BoxClient) -> int:
    link = await client.call(api.CREATE_SCREEN_LINK)
    url = login_link(link["code"])
    seconds = link["expiresInSeconds"]
    opener = _browser()
    if opener is not None and await asyncio.to_thread(_launch, opener, url):
        print(
            f"Opening this computer's screen in your browser. If it does not open, this link "
            f"works once, for {seconds} seconds:\n{url}"
        )
    else:
        print(
            f"Open this link in a browser on this computer; it works once, for {seconds} "
            f"seconds:\n{url}"
        )
    return 0
