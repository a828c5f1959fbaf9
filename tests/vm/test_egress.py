"""A task's network: only its broker's proxies, which let through what its hosts allow, against
a simulated outside world (testbed/outside_world.py). Each refusal is asserted, and so is its
`net.refused` line in the task's log."""

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.box_api import CURL_COULD_NOT_CONNECT, boxctl, finish, http, start_fake, wait_for_step
from testbed.machine import Machine
from testbed.outside_world import (
    ADDRESS,
    ADDRESS6,
    LINK_LOCAL_ADDRESS,
    PRIVATE_ADDRESS,
    PRIVATE_ADDRESS6,
    PRIVATE_NAME,
    PRIVATE_NAMES,
    arrived,
    start_outside,
)

UNSET_PROXIES = "env -u HTTP_PROXY -u http_proxy -u HTTPS_PROXY -u https_proxy -u BOX_SOCKS_PROXY"


@pytest.fixture(scope="module", autouse=True)
def outside(machine: Machine) -> Iterator[None]:
    server = start_outside(machine)
    yield
    server.kill()
    server.wait()


def run_task(machine: Machine, token: str, hosts: list[str], prompt: str) -> dict[str, Any]:
    task = start_fake(machine, token, prompt, hosts=hosts)
    return finish(machine, task["id"])


def texts(task: dict[str, Any]) -> list[str]:
    return [step["text"] for step in task["steps"]]


def refusals(machine: Machine, task_id: str) -> list[str]:
    machine.run("journalctl", "--sync")
    return machine.run(
        "journalctl", f"BOX_TASK={task_id}", "BOX_EVENT=net.refused", "-o", "cat"
    ).stdout.splitlines()


REFUSED_LINE = re.compile(r"Task \w+ was refused (\S+)(?: (\d+) times)?: ")


def counted(lines: list[str]) -> int:
    found = [REFUSED_LINE.match(line) for line in lines]
    assert all(found), lines
    return sum(int(m.group(2) or 1) for m in found if m)


def refusals_adding_up(
    machine: Machine, task_id: str, total: int, timeout: float = 30
) -> list[str]:
    """The task's refusal lines once their counts reach `total` (a line may wait out a second,
    or the broker's stop, to carry the refusals it stands for)."""
    deadline = time.monotonic() + timeout
    lines = refusals(machine, task_id)
    while counted(lines) < total and time.monotonic() < deadline:
        time.sleep(0.2)
        lines = refusals(machine, task_id)
    return lines


def refused_fetch(
    machine: Machine, token: str, hosts: list[str], url: str
) -> tuple[str, list[str]]:
    """Fetches a URL the proxy must refuse; returns the task's error and its refusal lines."""
    task = run_task(machine, token, hosts, f"fetch {url}")
    assert task["state"] == "failed", task
    assert task["steps"] == []
    return task["error"], refusals(machine, task["id"])


def test_a_listed_host_by_name_over_http_https_and_socks(machine: Machine, token: str) -> None:
    task = run_task(
        machine,
        token,
        ["allowed.test"],
        "fetch http://allowed.test/plain\n"
        "fetch https://allowed.test/tls\n"
        "sh curl -sS https://allowed.test/curl\n"
        'sh curl -sS -x "$BOX_SOCKS_PROXY" http://allowed.test/socks\n'
        "sh curl -sS -x socks5h://127.0.0.1:1080 https://allowed.test/socks-tls",
    )
    assert task["state"] == "done", task
    assert texts(task) == [
        "200 OK: hello from 80 /plain",
        "200 OK: hello from 443 /tls",
        "hello from 443 /curl",
        "hello from 80 /socks",
        "hello from 443 /socks-tls",
    ]
    assert refusals(machine, task["id"]) == []


def test_a_name_and_port_rule_allows_that_port_only(machine: Machine, token: str) -> None:
    task = run_task(
        machine,
        token,
        ["other.test:8080"],
        "fetch http://other.test:8080/on-its-port\nfetch http://other.test/on-80",
    )
    assert texts(task) == ["200 OK: hello from 8080 /on-its-port"]
    assert task["state"] == "failed"
    reason = "this task's hosts allow other.test on port 8080 only"
    assert task["error"] == (
        "The worker exited with status 1: line 2: fetch http://other.test/on-80: 403 Forbidden: "
        f"boxd refused other.test:80: {reason}"
    )
    assert refusals(machine, task["id"]) == [
        f"Task {task['id']} was refused other.test:80: {reason}"
    ]
    assert "/on-80" not in arrived(machine)


def test_a_wildcard_allows_subdomains_but_not_the_bare_domain(machine: Machine, token: str) -> None:
    task = run_task(
        machine,
        token,
        ["*.wild.test"],
        "fetch https://www.wild.test/sub\nfetch http://wild.test/bare",
    )
    assert texts(task) == ["200 OK: hello from 443 /sub"]
    assert task["state"] == "failed"
    assert (
        "403 Forbidden: boxd refused wild.test:80: it is not in this task's hosts"
        in (task["error"])
    )
    assert len(refusals(machine, task["id"])) == 1
    assert "/bare" not in arrived(machine)


def test_an_unlisted_host_is_refused_over_http_and_https(machine: Machine, token: str) -> None:
    error, refused = refused_fetch(machine, token, ["allowed.test"], "http://other.test/")
    assert error.endswith(
        "403 Forbidden: boxd refused other.test:80: it is not in this task's hosts"
    )
    assert len(refused) == 1
    error, refused = refused_fetch(machine, token, ["allowed.test"], "https://other.test/")
    # A refused CONNECT's words are in its status line, which aiohttp shows (its body it never
    # reads).
    assert error.endswith(
        "fetch https://other.test/: the proxy answered 403 Forbidden: boxd refused "
        "other.test:443: it is not in this task's hosts"
    )
    assert refused[0].endswith("was refused other.test:443: it is not in this task's hosts")


def test_a_task_without_hosts_reaches_nothing(machine: Machine, token: str) -> None:
    error, refused = refused_fetch(machine, token, [], "http://allowed.test/")
    assert error.endswith("its hosts list is empty")
    assert len(refused) == 1


def test_an_ip_literal_is_refused(machine: Machine, token: str) -> None:
    error, refused = refused_fetch(machine, token, ["allowed.test"], f"http://{ADDRESS}/ip")
    assert error.endswith(
        f"boxd refused {ADDRESS}:80: it is an IP address, and this task's hosts do not list "
        "that address"
    )
    assert len(refused) == 1
    assert "/ip" not in arrived(machine)


def test_ipv6_is_refused(machine: Machine, token: str) -> None:
    error, refused = refused_fetch(machine, token, ["allowed.test"], f"http://[{ADDRESS6}]/v6")
    assert "403 Forbidden: boxd refused" in error
    assert "it is an IP address" in error
    assert len(refused) == 1
    # Nor directly: the task's namespace has no IPv6 route, only loopback.
    task = run_task(
        machine,
        token,
        ["allowed.test"],
        f"sh curl -sS -g --noproxy '*' --max-time 5 http://[{ADDRESS6}]/v6-direct",
    )
    assert task["state"] == "failed"
    assert "Network is unreachable" in task["error"] or CURL_COULD_NOT_CONNECT.search(task["error"])
    assert "/v6" not in arrived(machine)


def test_udp_and_raw_dns_to_the_outside_are_refused(machine: Machine, token: str) -> None:
    probe = (
        "import socket\n"
        f"targets = ((socket.AF_INET, '{ADDRESS}'), (socket.AF_INET6, '{ADDRESS6}'))\n"
        "for family, address in targets:\n"
        "    try:\n"
        "        socket.socket(family, socket.SOCK_DGRAM).sendto(b'dns?', (address, 53))\n"
        "        print('sent', address)\n"
        "    except OSError as e:\n"
        "        print('udp', address, e.strerror)\n"
        "try:\n"
        "    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)\n"
        "    print('raw socket made')\n"
        "except OSError as e:\n"
        "    print('raw', e.strerror)\n"
    )
    machine.run("tee", "/usr/local/bin/udp-probe", input=probe)
    task = run_task(machine, token, ["allowed.test"], "sh python3 /usr/local/bin/udp-probe")
    assert task["state"] == "done", task
    assert texts(task)[0].splitlines() == [
        f"udp {ADDRESS} Network is unreachable",
        f"udp {ADDRESS6} Network is unreachable",
        "raw Operation not permitted",
    ]
    assert "udp 53" not in arrived(machine)


def test_a_listed_name_that_resolves_to_loopback_is_refused(machine: Machine, token: str) -> None:
    error, refused = refused_fetch(
        machine, token, ["sneaky.test"], "http://sneaky.test:7700/api/tasks"
    )
    assert error.endswith(
        "boxd refused sneaky.test:7700: sneaky.test resolves to 127.0.0.1, a loopback address: "
        "tasks never reach the box itself"
    )
    assert len(refused) == 1


def test_the_box_gateway_is_out_of_reach_directly_and_through_the_proxies(
    machine: Machine, token: str
) -> None:
    # NO_PROXY sends loopback direct, to the task's own loopback, where nothing listens on 7700.
    task = run_task(machine, token, ["allowed.test"], "fetch http://127.0.0.1:7700/api/tasks")
    assert task["state"] == "failed"
    assert "Cannot connect to host 127.0.0.1:7700" in task["error"]
    # Asked to, the proxies refuse it (a loopback rule cannot even be listed: see
    # test_a_listed_name_that_resolves_to_loopback_is_refused for a name that leads there).
    task = run_task(
        machine,
        token,
        ["allowed.test"],
        "sh curl -sS --noproxy '' -x http://127.0.0.1:3128 http://127.0.0.1:7700/api/tasks\n"
        "sh curl -sS --noproxy '' -x socks5h://127.0.0.1:1080 --max-time 5 "
        "http://127.0.0.1:7700/api/tasks",
    )
    assert texts(task) == [
        "boxd refused 127.0.0.1:7700: it is an IP address, and this task's hosts do not list "
        "that address"
    ]
    assert task["state"] == "failed"
    assert "SOCKS" in task["error"]
    # Two refusals of one host within a second: one line now, the second counted in the next.
    assert counted(refusals_adding_up(machine, task["id"], 2)) == 2


def test_socks_refuses_an_unlisted_host(machine: Machine, token: str) -> None:
    task = run_task(
        machine,
        token,
        ["allowed.test"],
        "sh curl -sS -x socks5h://127.0.0.1:1080 --max-time 5 http://other.test/socks-refused",
    )
    assert task["state"] == "failed"
    assert "SOCKS" in task["error"]
    assert refusals(machine, task["id"]) == [
        f"Task {task['id']} was refused other.test:80: it is not in this task's hosts"
    ]
    assert "/socks-refused" not in arrived(machine)


def test_a_child_that_unsets_the_proxy_variables_reaches_nothing(
    machine: Machine, token: str
) -> None:
    task = run_task(
        machine,
        token,
        ["allowed.test"],
        f"sh {UNSET_PROXIES} curl -sS --max-time 5 http://allowed.test/escape",
    )
    assert task["state"] == "failed"
    assert "Network is unreachable" in task["error"] or CURL_COULD_NOT_CONNECT.search(task["error"])
    python = (
        f'sh {UNSET_PROXIES} python3 -c "import urllib.request; '
        "urllib.request.urlopen('http://allowed.test/escape-py', timeout=5)\""
    )
    task = run_task(machine, token, ["allowed.test"], python)
    assert task["state"] == "failed"
    assert "Network is unreachable" in task["error"]
    assert "/escape" not in arrived(machine)


# What each of PRIVATE_NAMES is refused as, after "<name> resolves to <address>, ".
PRIVATE_REASONS = {
    "rfc1918-a.test": "a private network's address (RFC 1918)",
    "rfc1918-b.test": "a private network's address (RFC 1918)",
    "rfc1918-c.test": "a private network's address (RFC 1918)",
    "cgnat.test": "a carrier-grade NAT address (100.64.0.0/10)",
    "ula.test": "a unique local IPv6 address (fc00::/7)",
    "multicast.test": "a multicast address, not the address of one host",
    "mapped.test": "a private network's address (RFC 1918)",
    "metadata.test": "a link-local address",
    "metadata6.test": "a cloud metadata service's address",
}


def test_a_listed_name_that_resolves_to_a_private_address_is_refused(
    machine: Machine, token: str
) -> None:
    # The attacker's DNS: every name is listed, each resolves into somebody's network.
    names = list(PRIVATE_NAMES)
    task = run_task(
        machine,
        token,
        [*names, PRIVATE_NAME],
        "\n".join(f"sh curl -sS --max-time 5 http://{name}/private-by-name" for name in names)
        + f"\nsh curl -sS --max-time 5 http://{PRIVATE_NAME}/private-by-name",
    )
    assert task["state"] == "done", task
    bodies = texts(task)
    assert len(bodies) == len(names) + 1
    for name, body in zip([*names, PRIVATE_NAME], bodies, strict=True):
        why = PRIVATE_REASONS.get(name, "a private network's address (RFC 1918)")
        assert body.startswith(f"boxd refused {name}:80: {name} resolves to "), body
        assert why in body, body
    # glibc may hand ::ffff:10.0.0.1 from /etc/hosts back as either form; both are 10.0.0.1.
    assert "10.0.0.1" in bodies[names.index("mapped.test")]
    lines = refusals(machine, task["id"])
    assert sorted(lines) == sorted(
        f"Task {task['id']} was refused {body.removeprefix('boxd refused ')}" for body in bodies
    )
    assert "/private-by-name" not in arrived(machine)


def test_a_private_address_the_hosts_list_is_the_owner_s_choice(
    machine: Machine, token: str
) -> None:
    task = run_task(
        machine,
        token,
        [PRIVATE_ADDRESS, f"[{PRIVATE_ADDRESS6}]", f"{PRIVATE_NAME}"],
        f"fetch http://{PRIVATE_ADDRESS}/listed\n"
        f"fetch http://[{PRIVATE_ADDRESS6}]/listed6\n"
        # The name leads to an address the owner listed: nothing the task could not reach.
        f"fetch http://{PRIVATE_NAME}/by-name",
    )
    assert task["state"] == "done", task
    assert texts(task) == [
        "200 OK: hello from 80 /listed",
        "200 OK: hello from 80 /listed6",
        "200 OK: hello from 80 /by-name",
    ]
    assert refusals(machine, task["id"]) == []
    # Listed on one port, the address is reached on that port only, by name or not.
    task = run_task(
        machine,
        token,
        [f"{PRIVATE_ADDRESS}:8080", PRIVATE_NAME],
        f"fetch http://{PRIVATE_NAME}:8080/port-listed\nfetch http://{PRIVATE_NAME}/port-unlisted",
    )
    assert texts(task) == ["200 OK: hello from 8080 /port-listed"]
    assert task["error"].endswith(
        f"boxd refused {PRIVATE_NAME}:80: {PRIVATE_NAME} resolves to {PRIVATE_ADDRESS}, a private "
        "network's address (RFC 1918): a task reaches one only when its hosts list the address "
        "itself"
    )
    assert "/port-unlisted" not in arrived(machine)


BROKER_CONNECTS = """
import errno, socket, sys
try:
    socket.create_connection((sys.argv[1], 80), timeout=5).close()
    print("connected")
except TimeoutError:
    print("timed out")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e)))
"""


# Runs a command in the cgroup of the unit named first, where the unit's IPAddressDeny= holds.
JOIN_THE_BROKER = """
pid=$(systemctl show -p MainPID --value "$0")
cgroup=$(sed -n 's/^0:://p' "/proc/$pid/cgroup")
root=$(findmnt -n -o TARGET -t cgroup2 | head -n 1)
echo $$ > "$root$cgroup/cgroup.procs" && exec "$@"
"""


def test_the_broker_unit_walls_off_link_local(machine: Machine, token: str) -> None:
    task = start_fake(machine, token, "step up\nsleep 120")
    wait_for_step(machine, task["id"])
    unit = f"box-broker@{task['id']}.service"
    try:
        shown = machine.run("systemctl", "show", unit, "-p", "IPAddressDeny", "--value").stdout
        assert {"169.254.0.0/16", "fe80::/10", "224.0.0.0/4", "ff00::/8"} <= set(shown.split())
        machine.run("tee", "/usr/local/bin/broker-connects", input=BROKER_CONNECTS)
        probe = ["python3", "/usr/local/bin/broker-connects", LINK_LOCAL_ADDRESS]
        # The neighbour answers anyone else on the machine...
        assert machine.run(*probe).stdout.strip() == "connected"
        # ...but not a process in the broker's cgroup, as if a bug let the broker try.
        inside = machine.run("sh", "-c", JOIN_THE_BROKER, unit, *probe)
        # The kernel drops its packets (a SYN that never leaves times out; some calls get EPERM).
        assert inside.stdout.strip() in ("timed out", "EPERM")
    finally:
        http(machine, "POST", f"/api/tasks/{task['id']}/stop", token)


FLOOD = """
import socket, sys, time
started = time.monotonic()
refused = 0
for n in range(int(sys.argv[1])):
    with socket.create_connection(("127.0.0.1", 3128)) as proxy:
        head = f"GET http://other.test/flood-{n} HTTP/1.1\\r\\nHost: other.test\\r\\n\\r\\n"
        proxy.sendall(head.encode())
        answer = b""
        while chunk := proxy.recv(65536):
            answer += chunk
        refused += answer.startswith(b"HTTP/1.1 403")
print(f"{refused} refused in {time.monotonic() - started:.2f} s")
"""


def test_a_flood_of_refusals_is_a_few_lines_that_count_every_one(
    machine: Machine, token: str
) -> None:
    machine.run("tee", "/usr/local/bin/refusal-flood", input=FLOOD)
    task = start_fake(
        machine, token, "sh python3 /usr/local/bin/refusal-flood 2000", hosts=["allowed.test"]
    )
    # The manager answers the owner while the flood goes on.
    deadline = time.monotonic() + 60
    while not refusals(machine, task["id"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    listed = boxctl(machine, "list", timeout=60)
    assert task["id"] in listed.stdout
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    said = texts(ended)[0]
    assert said.startswith("2000 refused in "), said
    seconds = float(said.split()[3])
    # Every refusal counted, none lost; the broker logs what it holds within a second, and
    # what is left when it stops.
    lines = refusals_adding_up(machine, task["id"], 2000)
    assert counted(lines) == 2000, lines
    # One line per second at most for the one host, plus the one that opens the flood.
    assert len(lines) <= seconds + 2, (seconds, lines)
    assert all("was refused other.test:80" in line for line in lines)
    assert "/flood" not in arrived(machine)
