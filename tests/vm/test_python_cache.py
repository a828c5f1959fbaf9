"""boxd's own processes run as units/python.env says: optimized, with the bytecode the
package's postinst compiled for them, which is whole, of the sources installed, and root's alone
(a file there a broker or a task could write would be code run in every broker)."""

import json

from testbed.machine import Machine, stage_deb

ENVIRONMENT_FILE = "/usr/lib/boxd/python.env"
PYTHON = "/usr/lib/boxd/venv/bin/python"
BOXD = "/usr/lib/boxd/venv/bin/boxd"

# Every module the three services and the installed apps' tools import, and whether its cached
# bytecode is there and of its source as installed: a module without it is compiled each time a
# broker starts, into memory the broker keeps.
CACHED = """
import importlib.util, json, os, sys
import boxd.broker.main, boxd.manager.main, boxd.web.main
from boxd.apps.entry_points import entry_points

for point in entry_points(group="boxd.apps"):
    for tool in point.load().tools:
        tool.input.model_json_schema()
modules, missing = 0, []
for name, module in sorted(sys.modules.items()):
    source = getattr(module, "__file__", None) or ""
    if not source.endswith(".py"):
        continue
    modules += 1
    cached = importlib.util.cache_from_source(source)
    try:
        with open(cached, "rb") as file:
            header = file.read(16)
    except OSError:
        missing.append(f"{name}: no {cached}")
        continue
    stat = os.stat(source)
    flags, mtime, size = (int.from_bytes(header[at : at + 4], "little") for at in (4, 8, 12))
    if (flags, mtime, size) != (0, int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF):
        missing.append(f"{name}: {cached} is not of {source}")
print(json.dumps({
    "optimize": sys.flags.optimize, "prefix": sys.pycache_prefix,
    "modules": modules, "missing": missing,
}))
"""


def environment_file(machine: Machine) -> dict[str, str]:
    text = machine.run("cat", ENVIRONMENT_FILE).stdout
    pairs = [line.split("=", 1) for line in text.splitlines() if line and line[0] != "#"]
    return {name: value for name, value in pairs}


def test_the_cache_holds_every_module_boxd_imports_and_is_root_s(machine: Machine) -> None:
    wanted = environment_file(machine)
    prefix = wanted["PYTHONPYCACHEPREFIX"]
    # As the units run Python, but writing nothing: a module this run compiled would be found.
    found = json.loads(
        machine.run(
            "sh",
            "-c",
            f'set -a; . {ENVIRONMENT_FILE}; PYTHONDONTWRITEBYTECODE=1 exec {PYTHON} -c "$0"',
            CACHED,
        ).stdout
    )
    assert found["optimize"] == 2 and found["prefix"] == prefix
    assert found["modules"] > 200
    assert found["missing"] == []
    # Nobody but root may write a file or directory there, nothing there is a link, and every
    # user may read it all (what one could not read, it would compile each time).
    loose = machine.run(
        "find", prefix, "(", "!", "-user", "root", "-o", "-perm", "/022", "-o", "-type", "l",
        "-o", "(", "-type", "f", "!", "-perm", "-444", ")",
        "-o", "(", "-type", "d", "!", "-perm", "-555", ")", ")",
    )  # fmt: skip
    assert loose.stdout == ""
    # And nothing is left beside it of the run that made it.
    assert machine.run("ls", "/usr/lib/boxd").stdout.split().count("pycache") == 1
    assert [
        name for name in machine.run("ls", "/usr/lib/boxd").stdout.split() if ".new." in name
    ] == []


def test_boxd_s_services_and_brokers_run_with_the_file_s_environment(machine: Machine) -> None:
    wanted = environment_file(machine)
    machine.run("systemctl", "start", "boxd-web.service")
    # The spares' brokers, started ahead, are brokers as every task's is. They are made once
    # the machine's checks have passed (boxd/manager/doctor), which begin when boxd is ready:
    # a moment after it is active, which is when this machine's install returned.
    machine.run(
        "timeout",
        "30",
        "sh",
        "-c",
        "until systemctl list-units --state=active --plain --no-legend 'box-broker@*.service'"
        " | grep -q .; do sleep 0.1; done",
        timeout=40,
    )
    brokers = machine.run(
        "systemctl", "list-units", "--state=active", "--plain", "--no-legend", "box-broker@*"
    ).stdout.split()
    units = ["boxd.service", "boxd-web.service"] + [u for u in brokers if u.endswith(".service")]
    assert len(units) > 2, units
    for unit in units:
        pid = machine.run("systemctl", "show", "-P", "MainPID", unit).stdout.strip()
        # A Type=simple unit is started once forked: until its command is executed, its main
        # process has systemd's environment.
        machine.run(
            "timeout",
            "10",
            "sh",
            "-c",
            f'until grep -q "{BOXD}" /proc/{pid}/cmdline; do sleep 0.05; done',
        )
        environ = machine.run("cat", f"/proc/{pid}/environ").stdout.split("\0")
        has = dict(item.split("=", 1) for item in environ if "=" in item)
        assert {name: has.get(name) for name in wanted} == wanted, unit


# What postinst runs as root with python -m or -c, or imports there.
PLANTED = (
    "compileall",
    "venv",
    "ensurepip",
    "aiohttp",
    "dbus_fast",
    "pydantic",
    "sdnotify",
    "segno",
    "systemd",
    "boxd",
)
MARKER = "/run/boxd-planted"
# Each says it ran, as root, and then stands aside for the real module, so that postinst goes
# on to whatever it runs next.
PLANT = """
import importlib, os, runpy, sys
open({marker!r}, "a").write({name!r} + "\\n")
sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
if __name__ == "__main__":
    runpy.run_module({name!r}, run_name="__main__", alter_sys=True)
else:
    del sys.modules[__name__]
    sys.modules[__name__] = importlib.import_module(__name__)
"""


def test_installing_runs_nothing_from_the_folder_it_is_started_in(machine: Machine) -> None:
    """python -m and -c put the working directory first on sys.path: root installing boxd from
    a folder others can write would import what they put there. Another user plants a module of
    each name postinst runs or imports, which says so as root."""
    machine.run("rm", "-rf", "/tmp/shared", MARKER)
    machine.run("install", "-d", "-m", "1777", "/tmp/shared")
    for name in PLANTED:
        machine.run(
            "sh",
            "-c",
            f"cat > /tmp/shared/{name}.py",
            input=PLANT.format(marker=MARKER, name=name),
            user="nobody",
        )
    # Staged again: a test before may have booted the machine again, which empties its /tmp.
    deb = stage_deb(machine)
    # Installed again (postinst runs as on an upgrade), from there, as a person would.
    machine.run("cp", deb, "/tmp/shared/")
    done = machine.run(
        "sh",
        "-c",
        f"cd /tmp/shared && DEBIAN_FRONTEND=noninteractive exec apt-get install -y --reinstall "
        f"./{deb.rsplit('/', 1)[1]}",
        check=False,
        timeout=300,
    )
    assert machine.run("cat", MARKER, check=False).stdout == ""
    assert done.returncode == 0, done.stderr
    assert machine.run("systemctl", "is-active", "boxd.service").stdout.strip() == "active"
