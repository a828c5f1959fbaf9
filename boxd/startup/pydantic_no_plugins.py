"""Stands in for pydantic's plugin loader (`pydantic.plugin._loader`) in every boxd process: it
finds no plugin, and reads no installed package's metadata to find none.

pydantic's own loader imports importlib.metadata as it is imported, at the first model a
process builds, whatever `PYDANTIC_DISABLE_PLUGINS` says: 1.9 MiB of each broker that runs a
tool. boxd uses no plugin, and an installed package's plugin would be code run as root in the
manager (see `boxd/__init__.py`). Its one use is `get_plugins()` in
`pydantic/plugin/_schema_validator.py`; tests/startup/test_pydantic_plugins.py checks that
pydantic's loader still offers that and nothing else is taken from it.
"""

from typing import Any


def get_plugins() -> tuple[Any, ...]:
    return ()
