"""A distribution that declares a `pydantic` plugin (an app could) gets no code run in boxd's
processes: not in the manager, which builds models as root, nor in a task's broker as it runs a
tool. Each process here is a fresh Python, as each of boxd's is."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SPY = """
import os
from pathlib import Path

Path(os.environ["SPY_MARK"]).write_text("loaded")


class Plugin:
    def new_schema_validator(self, *args, **kwargs):
        return None, None, None


plugin = Plugin()
"""

BUILD_A_MODEL = """
import pydantic

class Anything(pydantic.BaseModel):
    x: int

Anything(x=1)
"""

TOOL_CALL = """
from boxd.apps.registry import load

load("echo").tools[0].input.model_validate({"text": "hi"})
"""


@pytest.fixture
def spy(tmp_path: Path) -> Path:
    """A distribution on the path whose `pydantic` entry point marks the file it returns."""
    site = tmp_path / "site"
    (site / "spy_plugin-1.0.dist-info").mkdir(parents=True)
    (site / "spy_plugin.py").write_text(SPY)
    info = site / "spy_plugin-1.0.dist-info"
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: spy-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pydantic]\nspy = spy_plugin:plugin\n")
    return tmp_path / "mark"


def run(code: str, mark: Path) -> bool:
    """Runs `code` in a fresh Python with the spy on its path; whether the spy was loaded."""
    env = {key: value for key, value in os.environ.items() if key != "PYDANTIC_DISABLE_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join([str(mark.parent / "site"), *sys.path])
    env["SPY_MARK"] = str(mark)
    mark.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    return mark.exists()


def test_the_spy_is_loaded_by_a_process_that_is_not_boxd(spy: Path) -> None:
    """Without this, the tests below could pass with a spy that never loads."""
    assert run(BUILD_A_MODEL, spy)


def test_no_plugin_is_loaded_once_boxd_is_imported(spy: Path) -> None:
    assert not run("import boxd\n" + BUILD_A_MODEL, spy)


def test_the_manager_loads_no_plugin(spy: Path) -> None:
    assert not run("import boxd.manager.main\n" + BUILD_A_MODEL, spy)


def test_a_broker_running_a_tool_loads_no_plugin(spy: Path) -> None:
    assert not run("import boxd.broker.main\n" + TOOL_CALL, spy)


def test_boxctl_loads_no_plugin(spy: Path) -> None:
    assert not run("import boxd.cli.main\n" + BUILD_A_MODEL, spy)


def test_a_boxd_process_uses_boxd_s_loader_and_reads_no_package_metadata(spy: Path) -> None:
    code = (
        "import sys\nimport boxd\n"
        + BUILD_A_MODEL
        + "from boxd.patches import pydantic as no_plugins_loader\n"
        "assert sys.modules['pydantic.plugin._loader'] is no_plugins_loader\n"
        "assert 'importlib.metadata' not in sys.modules, 'importlib.metadata was imported'\n"
    )
    assert not run(code, spy)
