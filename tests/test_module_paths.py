"""Every module path written down in the repository names a module that exists.

Module paths live in strings the interpreter never checks: `python -m boxd.workers.mcp.relay` in the
MCP configuration, the workers' table, monkeypatches by dotted name, the broker's import list,
comments and docstrings that send the reader to `boxd/doors/door_cap.py`, the units, the
Makefile, the README. A module moved to another folder leaves such a path behind; this finds
it. A dotted path is good when its longest module prefix exists and the next name, if any, is
defined at the top of that module (`boxd.errors.Problem`, `boxd.apps.wallet:app`).
"""

import ast
import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The repository's Python packages: boxd, the test machine's harness, the tests, the benchmarks.
_PACKAGES = "(?:boxd|testbed|tests|bench)"
# `boxd.a.b` not inside a longer name (org.boxd.Box1, /opt/boxd.x), and `boxd/a/b.py`.
_DOTTED = re.compile(rf"(?<![\w.-]){_PACKAGES}(?:\.[A-Za-z_]\w*)+")
_FILE = re.compile(rf"(?<![\w/.-]){_PACKAGES}/[\w/]+\.py\b")
# `from boxd.patches import asyncio` in a program a test runs: the module is boxd.patches.asyncio.
_FROM = re.compile(r"\bfrom (boxd(?:\.\w+)*) import (\w+)")
# Names that look like module paths and are not: a unit, the sysusers file, the venv's .pth file
# (debian/postinst), the screen's key in the browser's sessionStorage, a test's logger, an entry
# point a test names because it is gone.
_NOT_MODULES = {
    "boxd.service",
    "boxd.conf",
    "boxd.pth",
    "boxd.session",
    "tests.paced",
    "tests.no_such_module",
}
# What a benchmark run `--against` an older checkout imports there when this one has no such name.
_OLDER_CHECKOUTS = {
    "bench/broker_import.py": {
        "boxd.apps.registry.find_tool",
        "boxd.approval",
        "boxd.step",
        "boxd.plain_errors",
    },
}


def _tracked(*patterns: str) -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--", *patterns], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.split()
    return [REPO / name for name in listed if (REPO / name).is_file()]


def _written_in(path: Path) -> Iterator[str]:
    """The text of a file where a path may be written: in Python, its strings and comments (a
    local variable named `boxd` is code, not a path); elsewhere, all of it."""
    text = path.read_text()
    if path.suffix != ".py":
        yield text
        return
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in (tokenize.STRING, tokenize.COMMENT):
            yield token.string


def _top_level(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """A module's own statements, into its ifs and trys, not into its functions and classes."""
    for statement in body:
        yield statement
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            yield from _top_level(getattr(statement, field, []))


@cache
def _top_names(module: Path) -> frozenset[str]:
    names: set[str] = set()
    for statement in _top_level(ast.parse(module.read_text()).body):
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(statement.name)
        elif isinstance(statement, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(statement, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in statement.names)
    return frozenset(names)


def _exists(dotted: str) -> bool:
    parts = dotted.split(".")
    place = REPO / parts[0]
    rest = parts[1:]
    while rest:
        package, module = place / rest[0], place / f"{rest[0]}.py"
        if (package / "__init__.py").is_file():
            place = package
        elif module.is_file():
            place = module
        else:
            break
        rest = rest[1:]
    if not rest or rest[0].startswith("__"):
        return True
    source = place / "__init__.py" if place.is_dir() else place
    return rest[0] in _top_names(source)


def _known(dotted: str, known: set[str]) -> bool:
    return any(dotted == name or dotted.startswith(f"{name}.") for name in known)


def _stale(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        name = str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
        known = _NOT_MODULES | _OLDER_CHECKOUTS.get(name, set())
        for text in _written_in(path):
            dotted = [*_DOTTED.findall(text), *(".".join(pair) for pair in _FROM.findall(text))]
            found += [
                f"{name}: {gone}" for gone in dotted if not (_known(gone, known) or _exists(gone))
            ]
            found += [
                f"{name}: {gone}" for gone in _FILE.findall(text) if not (REPO / gone).is_file()
            ]
    return found


def test_every_module_path_in_the_code_units_and_build_names_a_module() -> None:
    code = ("boxd/*.py", "testbed/*.py", "tests/*.py", "bench/*.py")
    files = _tracked(*code, "units", "pyproject.toml", "Makefile")
    # This file names gone modules on purpose, below.
    assert _stale([file for file in files if file != Path(__file__).resolve()]) == []


def test_every_module_path_in_the_readme_and_docs_names_a_module() -> None:
    assert _stale(_tracked("README.md", "docs/*.md")) == []


def test_a_moved_module_left_behind_is_found(tmp_path: Path) -> None:
    written = tmp_path / "note.md"
    written.write_text(
        "boxd.errors.Problem and boxd/errors.py exist; boxd.apps.wallet:app too; "
        "boxd.service is a unit; boxd.errors.__file__ a name; "
        "boxd.gone and boxd/gone.py and boxd.errors.Gone do not, "
        "nor what `from boxd import gone` would import."
    )
    assert [line.split(": ")[1] for line in _stale([written])] == [
        "boxd.gone",
        "boxd.errors.Gone",
        "boxd.gone",
        "boxd/gone.py",
    ]
