"""The patch of asyncio (the standard library's, so pinned by requires-python alone): it is
imported with ssl held back, and ssl is handed to it on its first import by anyone.

import_asyncio_without_ssl()
    what:     asyncio's modules are imported while `import ssl` fails, which they allow (their
              `ssl` global is None then); a finder first on sys.meta_path gives ssl, on its
              first import afterwards, to asyncio.base_events, selector_events and sslproto
              (their `ssl` and sslproto's SSLAgainErrors, as their own import would have set
              them), and SSLProtocol.__init__ imports ssl first until then, so asyncio asked
              for TLS with no context of the caller's (`ssl=True`) gets it.
    why:      most of a task's processes never speak TLS, and asyncio would load ssl and OpenSSL
              into each of them: a broker does only for its model upstream (aiohttp's client,
              imported on the gateway's first connection) or a tool whose app does; a worker
              and the MCP relay never do. What it saves each: docs/performance.md, "asyncio
              without ssl".
    where:    the per-task entry points alone, first thing: the broker (boxd/main.py), the
              workers (boxd/workers/ahead.py, fake.py, droid/worker.py as programs) and the MCP
              relay (boxd/workers/mcp/relay.py). The root manager's asyncio is never patched
              (docs/decisions.md, "asyncio without ssl, in a task's processes only").
    for:      CPython 3.11 to 3.13's asyncio.
    tests:    tests/patches/test_late_ssl.py; its shape: tests/patches/test_shapes.py.

Nothing that asks for ssl goes without: the hold lasts for asyncio's own import alone, and is
not made in a process where asyncio or ssl is imported already, or where threads already run.
"""

import importlib.abc
import sys
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any


def import_asyncio_without_ssl() -> None:
    """Imports asyncio with ssl held back, unless either is imported already, or threads run
    (the hold is the whole process's: a module a thread imported meanwhile would go without
    ssl for good; boxd's own processes import boxd before they start any)."""
    if "asyncio" in sys.modules or "ssl" in sys.modules or _threads_running():
        return
    # A None in sys.modules makes `import ssl` raise ImportError, which asyncio's modules catch.
    sys.modules["ssl"] = None  # type: ignore[assignment]
    try:
        from asyncio import sslproto
    finally:
        del sys.modules["ssl"]
    sys.meta_path.insert(0, _SslFinder())
    # asyncio itself needs ssl when asked for TLS with no context of the caller's (ssl=True):
    # every TLS connection, client or server, begins with an SSLProtocol.
    protocol_init = sslproto.SSLProtocol.__init__

    def __init__(self: sslproto.SSLProtocol, *args: Any, **kwargs: Any) -> None:
        import ssl  # noqa: F401  (the finder hands it to asyncio, which sets __init__ back)

        protocol_init(self, *args, **kwargs)

    sslproto.SSLProtocol.__init__ = __init__  # type: ignore[method-assign]
    global _protocol_init
    _protocol_init = protocol_init


# asyncio's own SSLProtocol.__init__ while boxd's stands in for it, until ssl arrives.
_protocol_init: Callable[..., None] | None = None


def _threads_running() -> bool:
    threading = sys.modules.get("threading")
    return threading is not None and threading.active_count() > 1


def _hand_to_asyncio(ssl: ModuleType) -> None:
    """What asyncio's modules would have set at their import had ssl been there."""
    from asyncio import base_events, selector_events, sslproto

    for module in (base_events, selector_events, sslproto):
        module.ssl = ssl  # type: ignore[attr-defined]
    sslproto.SSLAgainErrors = (ssl.SSLWantReadError, ssl.SSLSyscallError)
    global _protocol_init
    if _protocol_init is not None:
        sslproto.SSLProtocol.__init__ = _protocol_init  # type: ignore[method-assign]
        _protocol_init = None


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
            # Not this finder, nor another one like it (each would ask the other, for ever).
            if isinstance(finder, _SslFinder) or find is None:
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
