"""The patch of pydantic: a stand-in for its plugin loader, `pydantic.plugin._loader` (a
private module), which finds no plugin and reads no installed package's metadata to find none.

get_plugins()
    what:     boxd/__init__.py puts this module in sys.modules as `pydantic.plugin._loader`
              before anything imports pydantic, in every boxd process; pydantic's one use of
              its loader is `get_plugins()` in pydantic/plugin/_schema_validator.py.
    why:      pydantic's own loader imports importlib.metadata as it is imported, at the first
              model a process builds, whatever `PYDANTIC_DISABLE_PLUGINS` says: memory in each
              broker that runs a tool (docs/performance.md, "What a process's imports cost"). boxd
              uses no plugin, and an installed package's plugin would be code run as root in
              the manager (see boxd/__init__.py).
    for:      pydantic 2.14 (pyproject.toml pins >=2.14,<2.15: docs/decisions.md says why).
    tests:    tests/patches/test_pydantic_plugins.py; its shape: tests/patches/test_shapes.py.
"""

from typing import Any


def get_plugins() -> tuple[Any, ...]:
    return ()
