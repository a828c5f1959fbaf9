"""How the screen shows text a task wrote, run in node against the page's own module: a diff's
lines marked as what they are, and characters that would make text read other than it is
(bidi overrides, invisible marks, control characters) shown as visible escapes."""

import json
import shutil
import subprocess
from importlib import resources

import pytest

DOM = resources.files("boxd.web").joinpath("screen").joinpath("dom.js")
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


def _run(call: str) -> object:
    script = f"import * as dom from {json.dumps(str(DOM))};\nconsole.log(JSON.stringify({call}));"
    assert NODE is not None
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", script], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def test_a_removed_line_that_starts_with_two_dashes_is_marked_removed() -> None:
    diff = "--- a/x.sql\n+++ b/x.sql\n@@ -1,2 +1,2 @@\n--- check the owner\n+++i;\n keep\n"
    kinds = _run(f"dom.diffKinds({json.dumps(diff)}.split('\\n'))")
    assert kinds == ["", "", "hunk", "del", "add", "", ""]


def _shown(text: str, lines: bool = False) -> object:
    return _run(f"dom.shown({json.dumps(text)}, {json.dumps(lines)})")


def test_bidi_overrides_and_controls_in_task_text_show_as_escapes() -> None:
    name = "invoice\u202etxt.exe\u200b\x07\r\n\t"
    assert _shown(name) == "invoice\\u202etxt.exe\\u200b\\x07\\r\\n\t"
    assert _shown("a\nb\u2028", lines=True) == "a\nb\\u2028"
    assert _shown("plain héllo 名前 🙂") == "plain héllo 名前 🙂"
