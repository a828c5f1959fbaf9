"""Where tests live (docs/testing.md, "Where the tests are"): the unit tests of a module of a
package of boxd in the folder of the same path under `tests/`, so a module's tests are found by
its path; what tests share in `tests/support/`; the test machine's harness in `testbed/`, which
the wheel leaves out; `tests/vm/` only its tests."""

import ast
import tomllib
from fnmatch import fnmatchcase
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
# Folders of tests/ that mirror no boxd package, each for a reason: what tests share, and the
# tests against a real systemd, which test the box as a whole.
NOT_MIRRORED = {"support", "vm"}


def _folders(top: Path) -> list[Path]:
    return sorted(p for p in top.rglob("*") if p.is_dir() and p.name != "__pycache__")


def _packages(top: Path) -> list[str]:
    """The dotted names of the Python packages in the folder `top` and below it."""
    found = [top, *(p for p in _folders(top) if (p / "__init__.py").is_file())]
    return [".".join(p.relative_to(REPO).parts) for p in found if (p / "__init__.py").is_file()]


def test_each_folder_of_unit_tests_mirrors_a_boxd_package() -> None:
    strays = []
    for folder in _folders(TESTS):
        relative = folder.relative_to(TESTS)
        if relative.parts[0] in NOT_MIRRORED:
            continue
        if not (REPO / "boxd" / relative / "__init__.py").is_file():
            strays.append(f"tests/{relative}: boxd/{relative}/ is no package")
    assert strays == []


def test_every_folder_of_tests_is_a_package() -> None:
    # Test files of the same name in two folders (tests/broker/test_idle.py beside another
    # test_idle.py) need their folders to be packages, or pytest imports both as `test_idle`.
    assert [f for f in _folders(TESTS) if not (f / "__init__.py").is_file()] == []


def test_the_vm_folder_holds_its_tests_and_their_fixtures_only() -> None:
    modules = {p.name for p in (TESTS / "vm").glob("*.py")}
    harness = sorted(m for m in modules if m not in {"__init__.py", "conftest.py"})
    assert [m for m in harness if not m.startswith("test_")] == []


def test_no_test_module_imports_another() -> None:
    # What two test modules share lives in tests/support/ or testbed/, where it is found.
    found = []
    for top in ("tests", "testbed", "bench"):
        for path in sorted((REPO / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                for name in names:
                    if name.split(".")[-1].startswith("test_") and name.startswith("tests."):
                        found.append(f"{path.relative_to(REPO)}: {name}")
    assert found == []


def test_the_wheel_takes_boxd_and_nothing_else() -> None:
    with (REPO / "pyproject.toml").open("rb") as f:
        find = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]
    include, exclude = find.get("include", ["*"]), find.get("exclude", [])
    shipped = [
        name
        for top in ("boxd", "testbed", "tests", "bench")
        for name in _packages(REPO / top)
        if any(fnmatchcase(name, p) for p in include)
        and not any(fnmatchcase(name, p) for p in exclude)
    ]
    assert "boxd.wire.models" in shipped
    assert [name for name in shipped if name.split(".")[0] != "boxd"] == []
