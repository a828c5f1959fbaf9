"""`boxctl open`: a one-time link to this computer's own screen, opened in the owner's browser
where there is a desktop, printed otherwise."""

import asyncio
import os
import shutil
import subprocess
from urllib.parse import urlencode

from boxd.dbus.client import BoxClient
from boxd.web.screen_session import LOGIN_PATH, SCREEN_ADDRESS


def _browser() -> str | None:
    """xdg-open, when there is a desktop session for it to open a browser in."""
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return None
    return shutil.which("xdg-open")


def _launch(opener: str, url: str) -> bool:
    # Not waited for: some browsers keep xdg-open until they close.
    try:
        subprocess.Popen(
            [opener, url],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return False
    return True


async def open_screen(client: BoxClient) -> int:
    link = await client.call("CreateScreenLink")
    url = f"{SCREEN_ADDRESS}{LOGIN_PATH}?{urlencode({'code': link['code']})}"
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
