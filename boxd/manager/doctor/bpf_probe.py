"""Whether systemd really enforces `IPAddressDeny=`, found by trying: a transient unit denied
every address sends a datagram to a socket of its own on loopback.

systemd implements the address filter with BPF programs on the unit's cgroup. Where it cannot
(no cgroup v2, a kernel without CONFIG_CGROUP_BPF, a container whose seccomp filter refuses
the bpf() system call), it logs a line and starts the unit without the filter: a task would
run with its second wall silently gone. Reading the kernel's configuration would not tell
whether systemd could load the program; a unit that tries does, in about 0.1 s.

The probe runs in a network namespace of its own (PrivateNetwork=), so it touches nothing of the
machine's. The filter makes the send fail at once with EPERM; a datagram, unlike a TCP connect,
never waits for a retry. Only that EPERM counts as enforced: a send that went through, or
anything else, is not (fail closed).
"""

import sys

from dbus_fast import Variant

from boxd.manager.doctor.leftovers import UNIT_PREFIX
from boxd.manager.units.sandbox import DENY_EVERY_ADDRESS
from boxd.manager.units.systemd import CLD_EXITED, UnitStatus
from boxd.wire.doctor import Finding, failed, passed

NAME = "IPAddressDeny (BPF)"
# Exit statuses of the probe: its send refused (the filter works), its datagram arrived.
REFUSED, REACHED = 0, 3
_ERRNO_EPERM = 1
# The probe's dynamic user, and how long it may take: about 0.1 s, its wait for its own
# datagram is 2 s; the rest is for a slow machine's Python to start.
PROBE_USER = "boxd-doctor"
PROBE_SECONDS = 15
PROBE = f"""
import socket, sys
here = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
here.bind(("127.0.0.1", 0))
here.settimeout(2)
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"?", here.getsockname())
except OSError as error:
    sys.exit({REFUSED} if error.errno == {_ERRNO_EPERM} else 4)
here.recv(1)
sys.exit({REACHED})
"""
_FIX = (
    "run boxd where systemd can attach BPF programs to cgroups: Linux with cgroup v2 and "
    "CONFIG_CGROUP_BPF (Debian's kernels have both), and, in a container, the bpf() system call "
    "allowed (systemd-nspawn --system-call-filter=bpf); then restart boxd or run boxctl doctor."
)


def unit_name(token: str) -> str:
    return f"{UNIT_PREFIX}{token}.service"


def properties(python: str = sys.executable) -> list[tuple[str, Variant]]:
    """The probe unit: Python, isolated and without site, as a user of its own, in its own
    network, for PROBE_SECONDS at most."""
    argv = [python, "-I", "-S", "-c", PROBE]
    return [
        ("Description", Variant("s", "boxd doctor: is IPAddressDeny= enforced?")),
        ("ExecStart", Variant("a(sasb)", [[python, argv, False]])),
        # A uid no other process has (not nobody, which any daemon or NFS-squashed owner may
        # be): another process of the same uid could stop the probe, holding the checks and so
        # every task's start, or ptrace it into exiting REFUSED on a machine that enforces
        # nothing. Named, not derived from the unit's name, which may be too long for a user's.
        ("DynamicUser", Variant("b", True)),
        ("User", Variant("s", PROBE_USER)),
        # A oneshot waits for its process without end unless told: a probe that hangs fails
        # the check (killed, result "timeout") rather than hold the checks.
        ("TimeoutStartUSec", Variant("t", PROBE_SECONDS * 1_000_000)),
        ("NoNewPrivileges", Variant("b", True)),
        ("PrivateNetwork", Variant("b", True)),
        DENY_EVERY_ADDRESS,
    ]


def verdict(status: UnitStatus, unit: str) -> Finding:
    """What the probe's end says of the filter."""
    exited = status.main_code == CLD_EXITED
    if exited and status.main_status == REFUSED:
        return passed(NAME, blocks=True)
    if exited and status.main_status == REACHED:
        return failed(
            NAME,
            "systemd does not enforce IPAddressDeny= here: a unit denied every address still "
            "reached a socket of its own on loopback. A task's network filter would be "
            "silently missing.",
            _FIX,
            blocks=True,
        )
    return failed(
        NAME,
        f"the unit that tries IPAddressDeny= did not run to its end as expected ({status.result}, "
        f"exit status {status.main_status}), so whether the filter works is unknown.",
        f"journalctl -u {unit} says why; {_FIX}",
        blocks=True,
    )
