"""What the VM suites need that takes minutes to make the first time (each release's image and
its fresh one, the .deb of this tree, the packages test_clients.py installs), made side by side
while `make test` runs lint and the unit tests.

Each is cached and locked where it is made (testbed/image.py, testbed/fresh_image.py,
testbed/deb_package.py, testbed/client_cache.py): a suite that starts before one is ready waits
for it, and one that failed here is tried again there and fails with its own words. So this
prints what it made and how long it took, and never fails `make test` itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

SUITES = ("trixie", "bookworm")


def _made(what: str, argv: list[str], env: dict[str, str]) -> str:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    took = time.monotonic() - started
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        return f"{what}: failed after {took:.0f} s (the VM suite tries again):\n{tail}"
    return f"{what}: ready in {took:.0f} s"


def main() -> None:
    python = sys.executable
    jobs = [
        (f"the {suite} image", [python, "-m", "testbed.image"], {"BOXD_SUITE": suite})
        for suite in SUITES
    ]
    jobs += [
        (f"the fresh {suite} image", [python, "-m", "testbed.fresh_image"], {"BOXD_SUITE": suite})
        for suite in SUITES
    ]
    jobs.append(("the .deb", [python, "-m", "testbed.deb_package"], {}))
    jobs.append(("the clients' packages", [python, "-m", "testbed.client_cache"], {}))
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [
            pool.submit(_made, what, argv, dict(os.environ, **extra)) for what, argv, extra in jobs
        ]
        for future in futures:
            print(f"[boxd-test prepare] {future.result()}", flush=True)


if __name__ == "__main__":
    main()
