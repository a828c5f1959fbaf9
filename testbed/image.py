"""The Debian root file system that test machines boot: 13 "trixie" or 12 "bookworm".

`image()` returns a ready image directory, building it with debootstrap the first time. The
release is `BOXD_SUITE` (`trixie`, the current stable, unless set; or `bookworm`). Images are
cached under a directory named by a hash of the recipe (the release, the package lists and this
file's own text), so each release's image is cached beside the other's, and changing the recipe
builds a new image and never alters one a machine may be using as its read-only lower layer.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .file_lock import held

WAITING = "[boxd-test image] another process is building this image; waiting for it"
REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = Path(os.environ.get("BOXD_TEST_CACHE", "/var/cache/boxd-test")) / "images"

# The releases test machines are built for, by suite name: the current stable first.
SUITES: dict[str, str] = {"trixie": "Debian 13", "bookworm": "Debian 12"}
DEFAULT_SUITE = "trixie"
MIRROR = "http://deb.debian.org/debian"

# libpam-systemd is listed because polkitd fails to configure without it.
DEBIAN_PACKAGES: tuple[str, ...] = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "libpam-systemd",
    "polkitd",
    "python3",
    "python3-venv",
    "python3-systemd",
    "curl",
    "iproute2",
    "procps",
    "ca-certificates",
    "make",
    # What agents run, to test that the worker's sandbox leaves them working.
    "git",
    "gcc",
    "libc6-dev",
    "nodejs",
)

# Packages one release needs that the other does not have, or names otherwise.
SUITE_PACKAGES: dict[str, tuple[str, ...]] = {"trixie": (), "bookworm": ()}

# The screen's tests drive Debian's Chromium with Debian's WebDriver for it (one source
# package, so always the same version); nothing is downloaded at test time. Installed by apt
# after debootstrap, whose own resolver fails to configure GTK's dconf-service. Recommends
# are left out: fonts-liberation is Chromium's (metric-compatible Arial, Times and Courier)
# and DejaVu the default face, so screenshots show legible text.
BROWSER_PACKAGES: tuple[str, ...] = (
    "chromium",
    "chromium-driver",
    "fonts-dejavu-core",
    "fonts-liberation",
)

# They would reach for the network from inside test machines at random times.
MASKED_UNITS: tuple[str, ...] = ("apt-daily.timer", "apt-daily-upgrade.timer")

# The tests' own servers (a real SMTP server for the mail app), in a venv of their own so that
# nothing boxd imports comes from them. Test machines have no network: it must be in the image.
TEST_VENV = "/opt/boxd-test/venv"
TEST_PACKAGES: tuple[str, ...] = ("aiosmtpd>=1.4",)
HOSTNAME = "boxd-test"
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageError(RuntimeError):
    pass


def log(message: str) -> None:
    print(f"[boxd-test image] {message}", file=sys.stderr, flush=True)


def suite() -> str:
    """The release to build test machines of, from BOXD_SUITE."""
    chosen = os.environ.get("BOXD_SUITE", "").strip() or DEFAULT_SUITE
    if chosen not in SUITES:
        known = ", ".join(f"{name} ({release})" for name, release in SUITES.items())
        raise ImageError(
            f"BOXD_SUITE={chosen!r} is not a release test machines are built for; "
            f"set it to one of: {known}, or leave it unset for {DEFAULT_SUITE}"
        )
    return chosen


def debian_packages(suite_name: str) -> tuple[str, ...]:
    """What debootstrap installs for that release."""
    return DEBIAN_PACKAGES + SUITE_PACKAGES[suite_name]


def ensure_host_tools() -> None:
    """Install systemd-nspawn and debootstrap on the host if they are missing (fresh CI)."""
    if shutil.which("systemd-nspawn") and shutil.which("debootstrap"):
        return
    log("installing systemd-container and debootstrap on this host")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "systemd-container", "debootstrap"],
    ):
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise ImageError(
                f"could not install the tools that test machines need: {' '.join(argv)} "
                f"exited with status {done.returncode}\n{done.stdout}{done.stderr}"
            )
    if not (shutil.which("systemd-nspawn") and shutil.which("debootstrap")):
        raise ImageError("systemd-nspawn or debootstrap is still missing after apt-get install")


def recipe_hash(suite_name: str) -> str:
    recipe = {
        "suite": suite_name,
        "mirror": MIRROR,
        "packages": list(debian_packages(suite_name)),
        "browser": list(BROWSER_PACKAGES),
        "image.py": Path(__file__).read_text(),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def image() -> Path:
    """Return the root directory of a ready image, building it first if needed."""
    suite_name = suite()
    digest = recipe_hash(suite_name)
    root = CACHE_DIR / digest / "root"
    if root.is_dir():
        return root
    final = built_once(CACHE_DIR, digest, WAITING, lambda build: _build(build / "root", suite_name))
    _prune_old_images(keep=final)
    return root


def built_once(cache_dir: Path, digest: str, waiting: str, make: Callable[[Path], None]) -> Path:
    """cache_dir/digest, with `make` run on a folder that becomes it, unless it is already there.

    One build of a digest at a time (its lock); the rename is what makes an image visible, so a
    half-built one never is, and a build folder found under the lock is a dead build's.
    """
    final = cache_dir / digest
    ensure_host_tools()
    cache_dir.mkdir(parents=True, exist_ok=True)
    with held(cache_dir / f"{digest}.lock", waiting):
        # Someone else may have finished the same build while this process waited.
        if final.is_dir():
            return final
        for stale in cache_dir.glob(f".build-{digest}-*"):
            log(f"removing an unfinished build: {stale}")
            remove_tree(stale)
        build = Path(tempfile.mkdtemp(prefix=f".build-{digest}-", dir=cache_dir))
        try:
            make(build)
            build.chmod(0o755)
            build.rename(final)
        except BaseException:
            remove_tree(build)
            raise
    return final


def _prune_old_images(keep: Path, how_many: int = 3) -> None:
    """Delete all but the newest few images, sparing any that a machine is booted from.

    Every change to the recipe builds a new image of about 1.4 GB (Chromium is half of it).
    """
    with open("/proc/self/mountinfo") as f:
        mounts = f.read()
    images = sorted(
        (p for p in CACHE_DIR.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in images[how_many:]:
        # Machines mount their root overlay on the host, so a used image shows as a lowerdir.
        if old == keep or f"lowerdir={old}/root" in mounts:
            continue
        with held(CACHE_DIR / f"{old.name}.lock", WAITING):
            log(f"removing an old image: {old}")
            remove_tree(old)
        (CACHE_DIR / f"{old.name}.lock").unlink(missing_ok=True)


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve())
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return found


def remove_tree(path: Path) -> None:
    """Delete a directory, first unmounting whatever a failed build left mounted in it.

    Deleting through a leftover bind mount of /dev or /proc would reach into the host's.
    """
    for point in sorted(_mounts_under(path), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False)
    if _mounts_under(path):
        raise ImageError(f"{path} still has mounts in it; not deleting it")
    shutil.rmtree(path, ignore_errors=True)


def each_machine_its_own(root: Path, masked_units: tuple[str, ...]) -> None:
    """The units masked, the hostname, and an empty machine id, so every machine gets its own
    at boot instead of sharing the build's (D-Bus's copy a link to it, as Debian makes it)."""
    for unit in masked_units:
        link = root / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    (root / "etc/hostname").write_text(HOSTNAME + "\n")
    (root / "etc/machine-id").write_text("")
    dbus_id = root / "var/lib/dbus/machine-id"
    if dbus_id.is_file() and not dbus_id.is_symlink():
        dbus_id.unlink()
        dbus_id.symlink_to("/etc/machine-id")


def run_logged(argv: list[str], logfile: Path, what: str) -> None:
    with logfile.open("a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-40:])
        raise ImageError(
            f"building the test image failed while {what}: {' '.join(argv)} exited with "
            f"status {done.returncode}. Last lines of {logfile}:\n{tail}"
        )


def _in_image(root: Path, *argv: str) -> list[str]:
    # A plain chroot with a clean environment: the host's PIP_* and SSL settings point at
    # files and mirrors that do not exist inside the image.
    return [
        "chroot",
        str(root),
        "env",
        "-i",
        f"PATH={CONTAINER_PATH}",
        "LANG=C.UTF-8",
        "HOME=/root",
        *argv,
    ]


@contextmanager
def _proc_mounted(root: Path) -> Iterator[None]:
    # pip and ensurepip read /proc. /dev needs nothing: debootstrap made its device nodes.
    # No bind mounts of the host's /dev or /sys, so nothing the build does can reach them.
    target = root / "proc"
    subprocess.run(["mount", "-t", "proc", "proc", str(target)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "--lazy", str(target)], check=False)


def _build(root: Path, suite_name: str) -> None:
    started = time.monotonic()
    logfile = root.parent / "build.log"
    release = f"{SUITES[suite_name]} ({suite_name})"
    log(f"building a {release} test image in {root.parent} (takes about 3 minutes)")
    log(f"build log: {logfile}")

    packages = debian_packages(suite_name)
    log("debootstrap: installing " + ", ".join(packages))
    run_logged(
        [
            "debootstrap",
            "--variant=minbase",
            "--include=" + ",".join(packages),
            suite_name,
            str(root),
            MIRROR,
        ],
        logfile,
        "running debootstrap",
    )

    log("configuring: CA certificates, DNS, hostname, machine id")
    shutil.copyfile("/etc/resolv.conf", root / "etc/resolv.conf")
    image_ca_dir = root / HOST_CA_DIR.relative_to("/")
    image_ca_dir.mkdir(parents=True, exist_ok=True)
    if HOST_CA_DIR.is_dir():
        for cert in HOST_CA_DIR.glob("*.crt"):
            shutil.copyfile(cert, image_ca_dir / cert.name)
    # Nothing needs masking for boot: this image boots to "running" in nspawn in about 0.3 s
    # with no failed unit (systemd 252 and 257; `systemctl --failed`, `systemd-analyze blame`).
    each_machine_its_own(root, MASKED_UNITS)

    with _proc_mounted(root):
        run_logged(
            _in_image(root, "update-ca-certificates"), logfile, "adding the host's CA certificates"
        )
        log(f"creating {TEST_VENV} for the tests' servers: " + ", ".join(TEST_PACKAGES))
        run_logged(
            _in_image(root, "python3", "-m", "venv", TEST_VENV),
            logfile,
            "creating the tests' Python venv",
        )
        run_logged(
            _in_image(
                root,
                f"{TEST_VENV}/bin/pip",
                "install",
                "--no-cache-dir",
                "--disable-pip-version-check",
                *TEST_PACKAGES,
            ),
            logfile,
            "installing the tests' Python packages from PyPI",
        )
        log("apt-get: installing " + ", ".join(BROWSER_PACKAGES))
        run_logged(_in_image(root, "apt-get", "update", "-q"), logfile, "updating apt's lists")
        run_logged(
            _in_image(
                root,
                "DEBIAN_FRONTEND=noninteractive",
                "apt-get",
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                *BROWSER_PACKAGES,
            ),
            logfile,
            "installing Chromium and its WebDriver",
        )
        run_logged(_in_image(root, "apt-get", "clean"), logfile, "cleaning the apt cache")

    log(f"{release} image ready in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    print(image())
