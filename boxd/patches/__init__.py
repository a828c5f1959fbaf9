"""boxd's patches of other projects' internals, one module per patched library. Each module's
docstring says, for each patch, what it changes, why, the version it was written for and its
tests; tests/patches/test_shapes.py fails, naming the patch to revisit, when a patched library
no longer has the names, signatures or behaviour a patch relies on. A patched library's
version is pinned in pyproject.toml to the range its patches were written for (the rule:
docs/decisions.md, "Patched libraries are pinned").

| module | patches | applied by |
|---|---|---|
| dbus_fast.py | the bus writer's socket and its writes | boxd/dbus/client.py, manager |
| pydantic.py | pydantic's plugin loader | boxd/__init__.py, every process |
| asyncio.py | asyncio imported without ssl | a task's processes' entry points |

One patch of aiohttp lives with the doors it serves: boxd/doors/http_refusals.py wraps
aiohttp's RequestHandler.handle_error (its shape is checked in tests/patches/test_shapes.py too).

Nothing is imported here: a package's __init__ is loaded by every import of its modules, by
the broker too.
"""
