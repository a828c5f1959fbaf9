"""The link `boxctl open` prints (boxd/cli/open_screen.py) and the screen's page reads: the
gateway's address with the one-time code after `#login=`, which the browser never sends. The
page trades the code for a session (boxd/web/screen_session.py)."""

from urllib.parse import quote

# Where boxd-web listens (units/boxd-web.socket); `boxctl open` builds its link on it.
SCREEN_ADDRESS = "http://127.0.0.1:7700"
# The link is SCREEN_ADDRESS/#login=<code>: the page reads the code from its fragment.
LOGIN_FRAGMENT = "login"


def login_link(code: str) -> str:
    return f"{SCREEN_ADDRESS}/#{LOGIN_FRAGMENT}={quote(code, safe='')}"
