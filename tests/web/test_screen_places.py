"""Places in a workspace as the screen names them, run in node against the page's own module:
addresses that survive any name a task gives a file (slashes escaped per segment, %, #, ?,
bidi), the API's paths, sizes as people read them, where a rename sends an entry."""

import json
import shutil
import subprocess
from importlib import resources

import pytest

PLACES = resources.files("boxd.web").joinpath("screen").joinpath("places.js")
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


def _run(call: str) -> object:
    script = f"import * as p from {json.dumps(str(PLACES))};\nconsole.log(JSON.stringify({call}));"
    assert NODE is not None
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", script], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


HOSTILE = ["a b", "100%", "#x", "?q=1", "...", "%2e%2e", "invoice\u202etxt.exe", "名前", "a\nb"]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_goes_to_its_address_and_back_whole(name: str) -> None:
    parts = ["docs", name]
    address = _run(f"p.fileHash('ho me', {json.dumps(parts)})")
    assert isinstance(address, str) and address.startswith("#/file/ho%20me/docs/")
    # No character of the name can end the address or split it into another segment.
    assert "#" not in address[1:] and "?" not in address and len(address.split("/")) == 5
    segments = address.split("/")[2:]
    assert _run(f"p.placeOf({json.dumps(segments)})") == {"workspace": "ho me", "parts": parts}


def test_a_folder_address_and_the_apis_paths() -> None:
    assert _run("p.folderHash('home')") == "#/files/home"
    assert _run("p.folderHash('home', ['a', 'b c'])") == "#/files/home/a/b%20c"
    assert _run("p.apiPath('list', 'home')") == "/api/workspaces/home/list"
    assert (
        _run("p.apiPath('files', 'home', ['a', '50%.md'])")
        == "/api/workspaces/home/files/a/50%25.md"
    )
    assert _run("p.apiPath('archive', 'h/x', [])") == "/api/workspaces/h%2Fx/archive"


def test_a_broken_escape_is_a_name_no_file_has_not_an_exception() -> None:
    assert _run("p.placeOf(['home', '%E0%A4%A', '', 'x'])") == {
        "workspace": "home",
        "parts": ["%E0%A4%A", "x"],
    }
    assert _run("p.partsOf('/a//b/')") == ["a", "b"]


def test_sizes_as_people_read_them() -> None:
    sizes = [0, 999, 1000, 1234, 45_600, 1_000_000, 5 * 10**12, 2**63]
    assert _run(f"{json.dumps(sizes)}.map(p.humanSize)") == [
        "0 B",
        "999 B",
        "1.0 kB",
        "1.2 kB",
        "46 kB",
        "1.0 MB",
        "5.0 TB",
        "9.2 EB",
    ]
    assert _run("[p.humanSize(-1), p.humanSize('x')]") == ["", ""]


def test_a_ranged_answer_names_the_whole_size() -> None:
    assert _run("p.totalSize(206, 'bytes 0-9/12345', '10')") == 12345
    assert _run("p.totalSize(200, null, '77')") == 77
    assert _run("p.totalSize(200, null, null)") is None


def test_download_names_and_where_a_rename_goes() -> None:
    assert _run("p.downloadName('home', ['a', 'summary.md'], false)") == "summary.md"
    assert _run("p.downloadName('home', [], true)") == "home.tar"
    assert _run("p.downloadName('home', ['a', 'pics'], true)") == "home-pics.tar"
    assert _run("p.renamedTo(['a', 'b.md'], 'c.md')") == ["a", "c.md"]
    assert _run("p.renamedTo(['a', 'b.md'], 'x/y.md')") == ["x", "y.md"]
    assert _run("p.renamedTo(['a', 'b.md'], '  ')") is None
    assert _run("p.renamedTo(['a', 'b.md'], null)") is None
