#!/bin/bash
# Installs boxd on a systemd machine the way a package would: a venv in /usr/lib/boxd, the units,
# the D-Bus policy, the polkit action and rule, the system users; then starts it.
# Usage: install.sh WHEEL   (run as root; the files sit beside this script, in the source tree)
set -euo pipefail
# What it makes is read by boxd's users (the venv, the bytecode), whatever root's own umask.
umask 022
wheel=$(realpath -e -- "${1:?usage: install.sh path/to/boxd-*.whl}")
here=$(cd "$(dirname "$0")" && pwd)
source_tree=$(dirname "$here")
# Run from / and Python with -P: python -m and -c put the working directory first on sys.path,
# so root started here from a folder others can write would import their compileall.py.
cd /
prefix=/usr/lib/boxd

[ "$(id -u)" = 0 ] || { echo "install.sh: run me as root" >&2; exit 1; }
[ -d /run/systemd/system ] || { echo "install.sh: this machine does not run systemd" >&2; exit 1; }

# Debian's python3-systemd is used through system site packages rather than compiled here.
[ -x "$prefix/venv/bin/python" ] || python3 -P -m venv --system-site-packages "$prefix/venv"
"$prefix/venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall "$wheel"
"$prefix/venv/bin/python" -P -c 'import aiohttp, dbus_fast, pydantic, sdnotify, systemd.journal' || {
    echo "install.sh: $prefix/venv lacks boxd's dependencies; pip install them first" >&2; exit 1; }

# The bytecode boxd's own processes run with (python.env): compiled here, as root, for every
# module on their path, since none of them writes it. Made anew each time, beside the old and
# renamed into its place, so none is left of a module since removed and a process starting
# meanwhile finds the old or none; a module that does not compile is compiled as it is imported.
install -m 0644 "$here/python.env" "$prefix/python.env"
(
    set -a
    # shellcheck source=python.env
    . "$prefix/python.env"
    set +a
    case "$PYTHONPYCACHEPREFIX" in
        "$prefix"/?*) ;;
        *) echo "install.sh: python.env's PYTHONPYCACHEPREFIX is not under $prefix" >&2; exit 1 ;;
    esac
    cache=$PYTHONPYCACHEPREFIX
    rm -rf "$cache".new.*  # of a run cut short
    PYTHONPYCACHEPREFIX=$(mktemp -d "$cache.new.XXXXXX")
    chmod 0755 "$PYTHONPYCACHEPREFIX"
    mapfile -t path < <("$prefix/venv/bin/python" -P -c \
        'import os, sys; print("\n".join(p for p in sys.path if os.path.isdir(p)))')
    "$prefix/venv/bin/python" -P -m compileall -q -j 0 "${path[@]}" >&2 ||
        echo "install.sh: the modules above did not compile; each is compiled as it is imported" >&2
    rm -rf "$cache"
    mv "$PYTHONPYCACHEPREFIX" "$cache"
)

ln -sf "$prefix/venv/bin/boxctl" /usr/local/bin/boxctl
doc=/usr/share/doc/boxd
install -D -m 0644 "$source_tree/README.md" "$doc/README.md" 2>/dev/null || true
# The README links into docs/, which goes beside it (Documentation= in the units).
if [ -d "$source_tree/docs" ]; then
    rm -rf "$doc/docs.new"
    cp -R -P --no-preserve=ownership "$source_tree/docs" "$doc/docs.new"
    chmod -R u=rwX,go=rX "$doc/docs.new"
    rm -rf "$doc/docs"
    mv "$doc/docs.new" "$doc/docs"
fi
install -m 0644 "$here"/boxd.service "$here"/boxd-web.socket "$here"/boxd-web.service \
    "$here"/box-broker@.socket "$here"/box-broker@.service \
    "$here"/box-app@.socket "$here"/box-app@.service \
    "$here"/box-egress-http@.socket "$here"/box-egress-socks@.socket "$here"/box-model@.socket \
    "$here"/boxd-droid-install.service /etc/systemd/system/
install -D -m 0644 "$here/sysusers.d/boxd.conf" /usr/lib/sysusers.d/boxd.conf
install -D -m 0644 "$here/dbus/org.boxd.Box1.conf" /usr/share/dbus-1/system.d/org.boxd.Box1.conf
install -D -m 0644 "$source_tree/polkit/org.boxd.Box1.policy" \
    /usr/share/polkit-1/actions/org.boxd.Box1.policy
install -D -m 0644 "$source_tree/polkit/50-boxd.rules" /etc/polkit-1/rules.d/50-boxd.rules

systemd-sysusers /usr/lib/sysusers.d/boxd.conf
# Brokers load the box's secrets from vault/box and do not start without it; boxd makes it too.
install -d -m 0700 /var/lib/box/vault /var/lib/box/vault/box
# boxd-droid-install.service writes Droid here and nowhere else (boxd makes it too).
install -d -m 0755 /var/lib/boxd/droid
systemctl reload dbus.service
systemctl daemon-reload
systemctl enable --now boxd.service boxd-web.socket
systemctl restart boxd.service
