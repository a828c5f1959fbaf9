"""asyncio without ssl until something imports ssl.

asyncio imports ssl as it is imported itself, for the TLS it may be asked for; that is some
0.7 MiB of private memory in each process (OpenSSL's and the module's own), and most of boxd's
processes never speak TLS: a broker does only for its task's model upstream (aiohttp's client,
imported on the gateway's first connection) or for a tool whose app does. So boxd imports asyncio
with ssl held back, as asyncio allows (its modules take `ssl = None` when the import fails), and
the first import of ssl afterwards, by anyone, loads it and hands it to asyncio's modules as their
own import would have. Nothing that asks for ssl goes without: the hold lasts for asyncio's own
import alone.

tests/test_late_ssl.py holds asyncio's modules to what a process that imported ssl first has,
and a TLS connection through asyncio to working.
"""

import importlib.abc
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any


def import_asyncio_without_ssl() -> None:
    """Imports asyncio with ssl held back, unless either is imported already."""
    if "asyncio" in sys.modules or "ssl" in sys.modules:
        return
    # A None in sys.modules makes `import ssl` raise ImportError, which asyncio's modules catch.
    try:
        import asyncio  # noqa: F401
    finally:
        del sys.modules["ssl"]
    sys.meta_path.insert(0, _SslFinder())


def _hand_to_asyncio(ssl: ModuleType) -> None:
    """What asyncio's modules would have set at their import had ssl been there."""
    from asyncio import base_events, selector_events, sslproto

    for module in (base_events, selector_events, sslproto):
        module.ssl = ssl  # type: ignore[attr-defined]
    sslproto.SSLAgainErrors = (ssl.SSLWantReadError, ssl.SSLSyscallError)


class _SslFinder(importlib.abc.MetaPathFinder):
    """Finds ssl where the other finders do, with a loader that tells asyncio once it ran. It
    stays until then: a look that does not load (importlib.util.find_spec) must not end it."""

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != "ssl":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _TellingLoader(spec.loader, self)
                return spec
        return None


class _TellingLoader(importlib.abc.Loader):
    """ssl's own loader, which hands the module to asyncio once it is executed."""

    def __init__(self, loader: importlib.abc.Loader, finder: _SslFinder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _hand_to_asyncio(module)
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)

    def __getattr__(self, name: str) -> Any:
        # get_source, get_filename and the rest, for tracebacks and inspect.
        return getattr(self._loader, name)
