"""boxd's own processes run optimized (units/python.env: no docstrings, no asserts), so nothing
they show may come from a docstring or hang on an assert: each door's answer is the same in a
process run as the units run them as in a plain one."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "units"
ENVIRONMENT_FILE = "/usr/lib/boxd/python.env"

# What a task sees of every installed app's tools (GET /tools, as their runners show them), and
# the web's OpenAPI document, from a process that also imported each of boxd's services.
SHOWN = """
import json, sys
import boxd.apps.app_server, boxd.broker.main, boxd.manager.main, boxd.web.main
from boxd.apps.app_server import make_runner
from boxd.apps.registry import installed
from boxd.web.openapi import document

tools = {}
for name in installed():
    for tool in make_runner(name).tools():
        tools[tool["name"]] = {"description": tool["description"], "input": tool["input"]}
json.dump({"optimize": sys.flags.optimize, "tools": tools, "openapi": document()}, sys.stdout)
"""


def python_environment() -> dict[str, str]:
    lines = (UNITS / "python.env").read_text().splitlines()
    pairs = [line.split("=", 1) for line in lines if line.strip() and not line.startswith("#")]
    return {name: value for name, value in pairs}


def shown(environment: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", SHOWN],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def test_the_units_run_python_optimized(tmp_path: Path) -> None:
    environment = python_environment()
    assert environment["PYTHONOPTIMIZE"] == "2"
    # Its own cache here: /usr/lib/boxd/pycache is the package's postinst's, on a box.
    optimized = shown({**environment, "PYTHONPYCACHEPREFIX": str(tmp_path)})
    plain = shown({"PYTHONOPTIMIZE": "", "PYTHONNODEBUGRANGES": ""})
    assert optimized["optimize"] == 2 and plain["optimize"] == 0
    assert optimized["tools"] == plain["tools"]
    assert {"echo.say", "mail.send", "wallet.pay"} <= set(plain["tools"])
    assert optimized["openapi"] == plain["openapi"]


def test_every_unit_that_runs_boxd_s_python_reads_the_environment_file() -> None:
    running = {
        unit.name: unit.read_text()
        for unit in UNITS.glob("*.service")
        if "ExecStart=/usr/lib/boxd/venv/bin/boxd " in unit.read_text()
    }
    # The agents' installers only download, and run once; the rest run for good or once a task.
    assert set(running) == {
        "boxd.service",
        "boxd-web.service",
        "box-broker@.service",
        "box-app@.service",
        "boxd-droid-install.service",
        "boxd-claude-install.service",
    }
    for name, text in running.items():
        if name not in ("boxd-droid-install.service", "boxd-claude-install.service"):
            assert f"\nEnvironmentFile={ENVIRONMENT_FILE}\n" in text, name
    # The package puts the file where the units read it.
    rules = (ROOT / "debian/rules").read_text()
    assert "\n\tinstall -m 0644 units/python.env $(ROOT)$(PREFIX)/python.env\n" in rules
    assert "\nPREFIX := /usr/lib/boxd\n" in rules
