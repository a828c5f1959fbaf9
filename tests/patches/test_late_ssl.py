"""asyncio imported without ssl (boxd/patches/asyncio.py): a task's process that speaks no TLS never
loads ssl, one that does gets from asyncio all it would have had, and the root manager's asyncio is
never patched. Each case runs in a process of its own, as what is imported first is the point."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Every global of every asyncio module, told by what it is: a module by name, a class or a tuple
# of classes by where they come from, anything else by its type. An ssl that reached asyncio
# late differs here from one imported first in any name it left unset or set otherwise.
_DESCRIBE = """
import json, sys, types

def describe(value):
    if isinstance(value, types.ModuleType):
        return "module " + value.__name__
    if isinstance(value, type):
        return "class " + value.__module__ + "." + value.__qualname__
    if isinstance(value, tuple) and all(isinstance(item, type) for item in value):
        return ["class " + item.__module__ + "." + item.__qualname__ for item in value]
    return type(value).__name__

print(json.dumps({
    name: {key: describe(value) for key, value in vars(module).items()}
    for name, module in sorted(sys.modules.items())
    if module is not None and (name == "asyncio" or name.startswith("asyncio."))
}))
"""


# What a task's entry points do first (boxd/main.py's broker, boxd/workers/ahead.py, the workers
# and the MCP relay as programs).
HOLD = "from boxd.patches.asyncio import import_asyncio_without_ssl\nimport_asyncio_without_ssl()\n"


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout


def test_a_task_s_process_imports_asyncio_without_ssl() -> None:
    found = _run(
        HOLD + "import sys, boxd.broker.main, boxd.workers.fake, boxd.workers.mcp.relay\n"
        "import asyncio.base_events\n"
        "print(sorted(name for name in sys.modules if name in ('ssl', '_ssl')),"
        " asyncio.base_events.ssl)"
    )
    assert found.strip() == "[] None"


# A program run as its unit runs it, which says at its exit whether ssl was loaded and whether
# asyncio has it.
_AS_PROGRAM = """
import atexit, runpy, sys
def told():
    base_events = sys.modules.get("asyncio.base_events")
    print("ssl" in sys.modules, base_events is not None and base_events.ssl is not None)
atexit.register(told)
sys.argv = sys.argv[1:]
if sys.argv[0] == "boxd":
    from boxd.main import main
    main()
else:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(
    "command",
    [
        ["boxd", "broker", "no-such-task"],
        ["boxd.workers.fake"],
        ["boxd.workers.droid.worker"],
        ["boxd.workers.mcp.relay"],
    ],
)
def test_a_task_s_entry_points_hold_ssl_back(command: list[str]) -> None:
    # Without their environment each gives up at once, having imported what it runs with.
    done = subprocess.run(
        [sys.executable, "-I", "-c", _AS_PROGRAM, *command],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "")},
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode != 0, done.stdout
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_the_root_manager_s_asyncio_is_asyncio_s_own() -> None:
    found = _run(
        "import sys, boxd.manager.main, boxd.web.main, asyncio.base_events\n"
        "from boxd.patches.asyncio import _SslFinder\n"
        "print(asyncio.base_events.ssl is sys.modules['ssl'],"
        " any(isinstance(finder, _SslFinder) for finder in sys.meta_path))"
    )
    assert found.split() == ["True", "False"]


def test_ssl_imported_later_gives_asyncio_what_ssl_imported_first_does() -> None:
    first = json.loads(_run("import ssl, asyncio\n" + _DESCRIBE))
    later = json.loads(_run(HOLD + "import asyncio\nimport ssl\n" + _DESCRIBE))
    assert later == first
    assert later["asyncio.sslproto"]["ssl"] == "module ssl"
    assert later["asyncio.sslproto"]["SSLAgainErrors"] == [
        "class ssl.SSLWantReadError",
        "class ssl.SSLSyscallError",
    ]


def test_once_ssl_came_asyncio_s_tls_protocol_is_its_own_again() -> None:
    found = _run(
        HOLD + "import asyncio.sslproto\n"
        "init = asyncio.sslproto.SSLProtocol.__init__\n"
        "print(init.__module__)\n"
        "import ssl\n"
        "print(asyncio.sslproto.SSLProtocol.__init__.__module__)"
    )
    assert found.split() == ["boxd.patches.asyncio", "asyncio.sslproto"]


def test_a_look_for_ssl_that_does_not_load_it_leaves_asyncio_to_be_told() -> None:
    found = _run(
        HOLD + "import importlib.util, asyncio.sslproto\n"
        "assert importlib.util.find_spec('ssl') is not None\n"
        "assert asyncio.sslproto.ssl is None\n"
        "import ssl\n"
        "print(asyncio.sslproto.ssl is ssl)"
    )
    assert found.strip() == "True"


def test_asyncio_imported_before_boxd_is_left_as_it_is() -> None:
    found = _run(
        "import sys, asyncio\n"
        + HOLD
        + "print('ssl' in sys.modules, type(sys.meta_path[0]).__name__ == '_SslFinder')"
    )
    assert found.strip() == "True False"


def test_threads_running_before_boxd_get_no_hold() -> None:
    found = _run(
        "import sys, threading, time\n"
        "threading.Thread(target=time.sleep, args=(2,), daemon=True).start()\n"
        + HOLD
        + "import asyncio.sslproto\n"
        "print('ssl' in sys.modules, asyncio.sslproto.ssl is sys.modules.get('ssl'))"
    )
    assert found.strip() == "True True"


def test_a_second_finder_for_ssl_does_not_ask_the_first() -> None:
    found = _run(
        "import sys\n" + HOLD + "from boxd.patches.asyncio import _SslFinder\n"
        "sys.meta_path.insert(0, _SslFinder())\n"
        "import ssl, asyncio.sslproto\n"
        "print(asyncio.sslproto.ssl is ssl)"
    )
    assert found.strip() == "True"


# A TLS echo server on 127.0.0.1, started by `serve(context)`: in the process under test, or in a
# process of its own for a client whose process must not import ssl itself.
_ECHO_SERVER = """
async def serve(server_side):
    async def echo(reader, writer):
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    return await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_side)
"""

_TLS = (
    """
from boxd.patches.asyncio import import_asyncio_without_ssl
import_asyncio_without_ssl()  # first: asyncio comes without ssl
import asyncio, sys
assert asyncio.sslproto.ssl is None
import ssl  # after it, as the model gateway's aiohttp imports it
"""
    + _ECHO_SERVER
    + """
cert, key = sys.argv[1], sys.argv[2]

async def main():
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)
    client_side = ssl.create_default_context(cafile=cert)
    async with asyncio.timeout(20):
        server = await serve(server_side)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_side, server_hostname="localhost"
        )
        writer.write(b"over TLS\\n")
        said = (await reader.readline()).decode().strip()
        print(ssl.__name__, said, writer.get_extra_info("cipher")[1])
        writer.close()
        server.close()

asyncio.run(main())
"""
)

_TLS_SERVER = (
    """
import asyncio, ssl, sys
"""
    + _ECHO_SERVER
    + """
async def main():
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(sys.argv[1], sys.argv[2])
    server = await serve(server_side)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.sleep(30)

asyncio.run(main())
"""
)

# asyncio asked for TLS with its own context (ssl=True), and ssl never imported before.
_TLS_TRUE = """
from boxd.patches.asyncio import import_asyncio_without_ssl
import_asyncio_without_ssl()
import asyncio, sys

async def main():
    async with asyncio.timeout(20):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", int(sys.argv[1]), ssl=True, server_hostname="localhost"
        )
        writer.write(b"over TLS\\n")
        print((await reader.readline()).decode().strip(), writer.get_extra_info("cipher")[1])
        writer.close()

asyncio.run(main())
"""


def _certificate(directory: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command to make a certificate with")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        capture_output=True,
        check=True,
        timeout=60,
    )
    return cert, key


def test_tls_through_asyncio_works_with_ssl_imported_after_it(tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _TLS, str(cert), str(key)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ssl", "over", "TLS", "TLSv1.3"]


def test_tls_asked_of_asyncio_with_its_own_context_loads_ssl_and_checks_the_peer(
    tmp_path: Path,
) -> None:
    cert, key = _certificate(tmp_path)
    server = subprocess.Popen(
        [sys.executable, "-c", _TLS_SERVER, str(cert), str(key)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()

        def connect(trusted: Path) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-c", _TLS_TRUE, port],
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
                # The default context's certificates: the test's own, or a file that has none.
                env={**os.environ, "SSL_CERT_FILE": str(trusted), "SSL_CERT_DIR": str(tmp_path)},
            )

        trusted = connect(cert)
        assert trusted.returncode == 0, trusted.stderr
        assert trusted.stdout.split() == ["over", "TLS", "TLSv1.3"]
        (tmp_path / "none.pem").write_text("")
        stranger = connect(tmp_path / "none.pem")
        assert stranger.returncode != 0
        assert "CERTIFICATE_VERIFY_FAILED" in stranger.stderr
    finally:
        server.kill()
        server.wait()
