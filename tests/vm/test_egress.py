"""A task's network: only its broker's proxies, which let through what its hosts allow, against
a simulated outside world (tests/vm/outside_world.py). Each refusal is asserted, and so is its
`net.refused` line in the task's log."""

from collections.abc import Iterator
from typing import Any

import pytest

from tests.vm.box_api import finish, start_fake
from tests.vm.machine import Machine
from tests.vm.outside_world import ADDRESS, ADDRESS6, arrived, start_outside

UNSET_PROXIES = (
    "env -u HTTP_PROXY -u http_proxy -u HTTPS_PROXY -u https_proxy -u ALL_PROXY -u all_proxy"
)


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
        "sh curl -sS -x socks5h://127.0.0.1:1080 http://allowed.test/socks\n"
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
    assert error.endswith("fetch https://other.test/: the proxy answered 403 Forbidden")
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
    assert "Network is unreachable" in task["error"] or "Couldn't connect" in task["error"]
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
    assert len(refusals(machine, task["id"])) == 2


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
    assert "Network is unreachable" in task["error"] or "Couldn't connect" in task["error"]
    python = (
        f'sh {UNSET_PROXIES} python3 -c "import urllib.request; '
        "urllib.request.urlopen('http://allowed.test/escape-py', timeout=5)\""
    )
    task = run_task(machine, token, ["allowed.test"], python)
    assert task["state"] == "failed"
    assert "Network is unreachable" in task["error"]
    assert "/escape" not in arrived(machine)
