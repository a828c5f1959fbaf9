"""The sandbox of a task's worker unit, as transient unit properties for StartTransientUnit.

Each value's D-Bus type is the one systemd's org.freedesktop.systemd1 interface declares for it;
a wrong one makes systemd refuse the whole unit. What is left open is what agents need to run
node, python, git and compilers; docs/sandbox.md says why, exposure by exposure.
"""

import socket
from pathlib import Path

from dbus_fast import Variant

from boxd.claude.release import MANAGED_POLICY
from boxd.manager.units.netns import netns_path
from boxd.paths import broker_socket, task_own_home, task_work_dir
from boxd.wire.models.settings import Settings

# mount(2)'s MS_REC: what systemd sends for a BindPaths= entry without `norbind`.
_MS_REC = 16384
_EPERM = 1
_ANY_IPV4 = [int(socket.AF_INET), b"\0" * 4, 0]
_ANY_IPV6 = [int(socket.AF_INET6), b"\0" * 16, 0]
_LOOPBACK_IPV4 = [int(socket.AF_INET), bytes([127, 0, 0, 0]), 8]
_LOOPBACK_IPV6 = [int(socket.AF_INET6), b"\0" * 15 + b"\1", 128]
# Every address, both families: what a worker may reach beyond its loopback, and what the doctor's
# probe unit is denied to see that systemd really enforces it (boxd.manager.doctor.bpf_probe).
DENY_EVERY_ADDRESS = ("IPAddressDeny", Variant("a(iayu)", [_ANY_IPV4, _ANY_IPV6]))
_SHARED_TMPFS = "mode=1777,nosuid,nodev"
# CPUQuotaPerSecUSec is microseconds of CPU time per second of wall time.
_USEC_PER_PERCENT = 10_000


def _flag(name: str) -> tuple[str, Variant]:
    return (name, Variant("b", True))


def sandbox_properties(home: Path, task_id: str, settings: Settings) -> list[tuple[str, Variant]]:
    work = str(task_work_dir(home, task_id))
    door = str(broker_socket(home, task_id))
    own_home = str(task_own_home(home, task_id))
    return [
        ("ProtectSystem", Variant("s", "strict")),
        ("ProtectHome", Variant("s", "yes")),
        # BOX_HOME holds the database, the vault, every workspace and every task's layers and
        # broker socket: the worker sees an empty, root-owned BOX_HOME with only its own view,
        # its own home and its own broker socket in it, at their usual paths.
        # /run is where the box's services listen (the system bus, journald's native socket and
        # /dev/log, which would let a task write BOX_TASK fields as if boxd had, nscd, resolved,
        # userdb) and where other tasks' unit files and namespaces are: the worker gets an empty
        # one. Its stdout and stderr are connected to the journal before it starts.
        # The box's /dev/shm (which PrivateDevices= binds in) and /run/lock are world-writable
        # and shared: every task could read and fill them. Each worker gets its own, whose pages
        # count against its MemoryMax=.
        (
            "TemporaryFileSystem",
            Variant(
                "a(ss)",
                [
                    [str(home), "mode=0755"],
                    ["/run", "mode=0755"],
                    ["/dev/shm", _SHARED_TMPFS],
                    ["/run/lock", _SHARED_TMPFS],
                ],
            ),
        ),
        (
            "BindPaths",
            Variant(
                "a(ssbt)",
                [
                    [work, work, False, _MS_REC],
                    [own_home, own_home, False, 0],
                    [door, door, False, 0],
                ],
            ),
        ),
        # The box's message queues file system is not its own (mq_open does not need it). And
        # the machine's Claude Code policy (managed settings, hooks, MCP servers) is not the
        # task's: Claude Code reads it whatever --setting-sources says, and it would change
        # what a task's autonomy lets it do (docs/agents.md).
        ("InaccessiblePaths", Variant("as", ["-/dev/mqueue", f"-{MANAGED_POLICY}"])),
        _flag("PrivateTmp"),
        _flag("PrivateDevices"),
        _flag("PrivateIPC"),
        _flag("ProtectKernelTunables"),
        _flag("ProtectKernelModules"),
        _flag("ProtectKernelLogs"),
        _flag("ProtectControlGroups"),
        _flag("ProtectClock"),
        _flag("ProtectHostname"),
        # Other users' processes, so other tasks' and the box's own, are not in its /proc.
        ("ProtectProc", Variant("s", "invisible")),
        _flag("RestrictSUIDSGID"),
        # The bit mask of namespace kinds it may create: none.
        ("RestrictNamespaces", Variant("t", 0)),
        _flag("RestrictRealtime"),
        _flag("LockPersonality"),
        _flag("NoNewPrivileges"),
        _flag("RemoveIPC"),
        ("CapabilityBoundingSet", Variant("t", 0)),
        ("AmbientCapabilities", Variant("t", 0)),
        ("SystemCallFilter", Variant("(bas)", [True, ["@system-service"]])),
        # A call outside the list fails with EPERM, which runtimes that probe for newer calls
        # handle, rather than killing the agent.
        ("SystemCallErrorNumber", Variant("i", _EPERM)),
        ("SystemCallArchitectures", Variant("as", ["native"])),
        (
            "RestrictAddressFamilies",
            Variant("(bas)", [True, ["AF_UNIX", "AF_INET", "AF_INET6"]]),
        ),
        # Its own namespace has only loopback; the address filter is a second wall in case it
        # ever had more.
        ("NetworkNamespacePath", Variant("s", str(netns_path(task_id)))),
        DENY_EVERY_ADDRESS,
        ("IPAddressAllow", Variant("a(iayu)", [_LOOPBACK_IPV4, _LOOPBACK_IPV6])),
        ("MemoryMax", Variant("t", settings.taskMemoryMaxBytes)),
        ("TasksMax", Variant("t", settings.taskTasksMax)),
        ("CPUQuotaPerSecUSec", Variant("t", settings.taskCPUPercent * _USEC_PER_PERCENT)),
    ]
