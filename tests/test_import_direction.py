"""boxd's imports run one way, as its folders say.

A process's package (the root manager, the gateway, a task's broker, boxctl, a task's workers,
an app's runner) may import the shared packages; a shared package imports no process's package,
so what the broker loads never depends on the manager's code, nor the manager's on the broker's.
Nor does one process's package import another's, but for the few arrows allowed below, each
with its reason: what two processes share is said once, in a shared package (a wire format in
boxd/wire/).
No module imports itself back through others. And the wire's plain half stays plain: outside
boxd/wire/models/, no shared module imports pydantic or a model, so the broker can import any
(tests/test_broker_imports.py checks what a broker really loads). The D-Bus package and the App
SDK are the exceptions by design: the manager's task object sends models, and an app's tools
are pydantic models.
"""

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

BOXD = Path(__file__).resolve().parents[1] / "boxd"

PROCESSES = {"manager", "broker", "web", "cli", "workers", "apps"}
SHARED = {
    *("wire", "reading", "doors", "net", "droid", "claude", "patches", "dbus", "errors", "paths"),
    *("sdk", "agents"),
}
# The entry points, which start every process: `boxd` and the package's own start.
ENTRY = {"boxd", "boxd.main"}
# The arrows from one process's package into another's that are right as they are (the same
# reasons are in docs/architecture.md, "Which package imports which").
ALLOWED = {
    # The manager makes each installed app's user and runner, so it asks the apps' package which
    # apps there are: `installed` reads the packages' metadata and imports no app's code.
    ("boxd.manager.app_runners", "boxd.apps.registry"),
}


def _name(path: Path) -> str:
    parts = path.relative_to(BOXD.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_name(path): path for path in sorted(BOXD.rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import that runs, at the top or in a function; not those for the type checker."""
    for node in body:
        if isinstance(node, ast.If) and _type_checking(node):
            yield from _import_nodes(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                yield from _import_nodes([child])


@cache
def _imports(module: str) -> frozenset[str]:
    """What a module imports: boxd's modules by name, anything else by its top package."""
    path = _modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            above = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*above, base] if base else above)
        for alias in node.names:
            whole = f"{base}.{alias.name}"
            found.add(whole if whole in _modules() else base)
    return frozenset(found)


def _family(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_module_of_boxd_is_in_a_family() -> None:
    for module in _modules():
        if module not in ENTRY:
            assert _family(module) in PROCESSES | SHARED, f"{module} is in no family"


def test_no_shared_module_imports_a_process() -> None:
    wrong = [
        f"{module} imports {imported}"
        for module in _modules()
        if _family(module) in SHARED
        for imported in _imports(module)
        if imported.startswith("boxd.") and _family(imported) in PROCESSES
    ]
    assert wrong == []


def test_no_process_imports_another_but_as_allowed() -> None:
    arrows = {
        (module, imported)
        for module in _modules()
        if _family(module) in PROCESSES
        for imported in _imports(module)
        if imported.startswith("boxd.")
        and _family(imported) in PROCESSES
        and _family(imported) != _family(module)
    }
    assert sorted(arrows - ALLOWED) == []
    # An allowed arrow that is gone comes off the list.
    assert sorted(ALLOWED - arrows) == []


def test_outside_the_models_no_shared_module_imports_pydantic_or_a_model() -> None:
    wrong = [
        f"{module} imports {imported}"
        for module in _modules()
        if _family(module) in SHARED - {"dbus", "sdk"} and not module.startswith("boxd.wire.models")
        for imported in _imports(module)
        if imported.split(".")[0] in ("pydantic", "pydantic_core")
        or imported.startswith("boxd.wire.models")
    ]
    assert wrong == []


def test_no_module_imports_itself_back() -> None:
    modules = _modules()
    graph = {
        module: sorted(name for name in _imports(module) if name in modules) for module in modules
    }
    # Depth first, in order; a module met again while still on the path closes a cycle.
    state: dict[str, str] = {}
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for imported in graph[module]:
            if state.get(imported) == "open":
                cycles.append([*path[path.index(imported) :], imported])
            elif imported not in state:
                visit(imported, [*path, imported])
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module, [module])
    assert cycles == []
