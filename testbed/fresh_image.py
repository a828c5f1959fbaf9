"""A fresh Debian 13 or 12, as an owner has it before installing boxd: debootstrap's default
variant (every package of priority required and important, what the installer lays down before
its optional tasks), for tests/vm/test_fresh_install.py to prove that apt pulls in all boxd
needs from debian/control's Depends, and nothing from the suite's own image (testbed/image.py)
that already holds them.

Cached like the suite's image, by a hash of this recipe (the release, the mirror and this
file's text), but in a folder of its own: pruning there keeps the newest image of each release,
and neither folder's pruning can take the other's images, so the two kinds for two releases
never crowd each other out.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

from .file_lock import held
from .image import (
    CACHE_DIR,
    HOSTNAME,
    MIRROR,
    SUITES,
    ImageError,
    built_once,
    each_machine_its_own,
    log,
    remove_tree,
    run_logged,
    suite,
)

FRESH_DIR = CACHE_DIR.parent / "fresh-images"
WAITING = "[boxd-test image] another process is building this fresh image; waiting for it"

# Not on a fresh machine as Debian makes it, but what makes it one a test can use:
# - the host's resolv.conf, which a real install gets from its installer or DHCP: apt needs a
#   name server to reach the mirror (the machine shares the host's network);
# - an empty machine id, as the installer leaves it, so every machine makes its own at boot;
# - apt's daily timers masked: on a real machine they fetch lists and upgrade at random times,
#   which here would take dpkg's lock from under the test's own apt-get;
# - a hostname, which nspawn would otherwise set from the directory's name.
# Nothing more is needed to boot under systemd-nspawn: the default variant has systemd-sysv
# (init, priority important) in both releases, and the harness runs commands with nsenter,
# not through a login or D-Bus (which the default variant leaves out: boxd's Depends bring it).
MASKED_UNITS: tuple[str, ...] = ("apt-daily.timer", "apt-daily-upgrade.timer")


def recipe_hash(suite_name: str) -> str:
    recipe = {
        "suite": suite_name,
        "mirror": MIRROR,
        "hostname": HOSTNAME,
        "fresh_image.py": Path(__file__).read_text(),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def fresh_image(suite_name: str | None = None) -> Path:
    """The root directory of a fresh machine's image of that release (BOXD_SUITE's by
    default), built first if needed."""
    suite_name = suite_name or suite()
    digest = recipe_hash(suite_name)
    root = FRESH_DIR / digest / "root"
    if root.is_dir():
        return root

    def make(build: Path) -> None:
        _build(build / "root", suite_name)
        (build / "suite").write_text(suite_name + "\n")

    final = built_once(FRESH_DIR, digest, WAITING, make)
    _prune(keep=final, suite_name=suite_name)
    return root


def _prune(keep: Path, suite_name: str) -> None:
    """Delete this release's older fresh images (about 250 MB each), sparing any that a machine
    is booted from: another release's images are that release's to prune."""
    with open("/proc/self/mountinfo") as f:
        mounts = f.read()
    for old in FRESH_DIR.iterdir():
        if old == keep or not old.is_dir() or old.name.startswith("."):
            continue
        try:
            of = (old / "suite").read_text().strip()
        except FileNotFoundError:
            continue
        # Machines mount their root overlay on the host, so a used image shows as a lowerdir.
        if of != suite_name or f"lowerdir={old}/root" in mounts:
            continue
        with held(FRESH_DIR / f"{old.name}.lock", WAITING):
            log(f"removing an old fresh image: {old}")
            remove_tree(old)
        (FRESH_DIR / f"{old.name}.lock").unlink(missing_ok=True)


def _build(root: Path, suite_name: str) -> None:
    started = time.monotonic()
    logfile = root.parent / "build.log"
    release = f"fresh {SUITES[suite_name]} ({suite_name})"
    log(f"building a {release} image in {root.parent}; build log: {logfile}")
    run_logged(
        ["debootstrap", suite_name, str(root), MIRROR], logfile, "running debootstrap (fresh)"
    )
    if not (root / "sbin/init").exists():
        raise ImageError(f"the {release} image has no /sbin/init: debootstrap left out systemd")
    shutil.copyfile("/etc/resolv.conf", root / "etc/resolv.conf")
    each_machine_its_own(root, MASKED_UNITS)
    # What debootstrap downloaded: the test's apt-get must fetch what boxd needs itself.
    for cached in (root / "var/cache/apt/archives").glob("*.deb"):
        cached.unlink()
    log(f"{release} image ready in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    print(fresh_image())
