"""A module put into boxd's own Python environment in the machine as `pip install` leaves one
(the module, its dist-info with the entry points it declares), and taken away after: how a test
plays an app or a plugin a stranger published."""

from collections.abc import Iterator
from contextlib import contextmanager

from testbed.deb_package import VENV
from testbed.machine import Machine

PYTHON = f"{VENV}/bin/python"


@contextmanager
def installed_module(machine: Machine, name: str, source: str, entry_points: str) -> Iterator[None]:
    """`name`.py with `source`, declaring `entry_points` (the text of entry_points.txt)."""
    site = machine.run(PYTHON, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    where = machine.root / site.stdout.strip().lstrip("/")
    info = where / f"{name}-1.0.dist-info"
    module = where / f"{name}.py"
    info.mkdir()
    try:
        module.write_text(source)
        project = name.replace("_", "-")
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(entry_points)
        for path in (module, info, *info.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield
    finally:
        module.unlink(missing_ok=True)
        for path in info.iterdir():
            path.unlink()
        info.rmdir()
