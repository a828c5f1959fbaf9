"""Host rules a task's network may reach: `name`, `*.name` or `name:port`.

A rule is never the box itself (localhost, loopback), a link-local address, a cloud metadata
service, an address that is not one host's, or a whole top-level domain, whatever the caller
means by it: those would open the box's own services to the agent. A private address may be
listed: it is the owner's choice (boxd.net.address_screen).
"""

import ipaddress
import re
from typing import NoReturn

from boxd.errors import Problem, die
from boxd.net.address_screen import never_reached
from boxd.reading.decimal_text import decimal

MAX_HOSTS = 50
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_EXAMPLES = "a host is a name like example.com, *.example.com or example.com:8080"


def _refuse(rule: str, why: str) -> NoReturn:
    die(Problem.INVALID, f"hosts: {rule!r} {why}")


def _split_port(rule: str, text: str) -> tuple[str, int | None]:
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            _refuse(rule, f"is not a host; {_EXAMPLES}")
        if not rest:
            return host, None
        if not rest.startswith(":"):
            _refuse(rule, f"is not a host; {_EXAMPLES}")
        return host, _port(rule, rest[1:])
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, _port(rule, port)
    return text, None


def _port(rule: str, text: str) -> int:
    port = decimal(text, most_digits=5)
    if port is None or not 1 <= port <= 65535:
        _refuse(rule, "has a port that is not a number from 1 to 65535")
    return port


def _check_address(rule: str, host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    # The egress screen's own list: a rule for an address no task reaches would never work.
    why = never_reached(address)
    if why is not None:
        _refuse(rule, f"is {why}")
    return True


def check_host(raw: object) -> str:
    """Returns the rule in its canonical form (lower case) or raises a plain-words error."""
    if not isinstance(raw, str):
        die(Problem.INVALID, f"hosts: {raw!r} is not a string; {_EXAMPLES}")
    rule = raw.strip().lower()
    if not rule:
        _refuse(raw, f"is empty; {_EXAMPLES}")
    if "://" in rule or "/" in rule:
        _refuse(raw, "is a URL or a path, not a host; give the name alone, like example.com")
    wildcard = rule.startswith("*.")
    host, port = _split_port(raw, rule.removeprefix("*.") if wildcard else rule)
    if _check_address(raw, host):
        if wildcard:
            _refuse(raw, "puts *. before an address; *. only goes before a domain name")
        return rule
    if ":" in host:
        _refuse(raw, f"is not a host; {_EXAMPLES}")
    labels = host.rstrip(".").split(".")
    if not all(_LABEL.fullmatch(label) for label in labels) or len(host) > 253:
        _refuse(raw, f"is not a host; {_EXAMPLES}")
    if labels[-1] == "localhost" or labels[-1] == "localdomain":
        _refuse(raw, "is the box itself: tasks never reach localhost")
    if len(labels) == 1:
        _refuse(raw, "is a whole top-level domain, not a host")
    if labels[-1].isdigit():
        _refuse(raw, f"is not a host; {_EXAMPLES}")
    suffix = "" if port is None else f":{port}"
    return f"*.{host}{suffix}" if wildcard else f"{host}{suffix}"


def check_hosts(raw: object) -> list[str]:
    if not isinstance(raw, list):
        die(Problem.INVALID, "hosts must be a list of host names")
    if len(raw) > MAX_HOSTS:
        die(Problem.INVALID, f"hosts has {len(raw)} names; at most {MAX_HOSTS} are allowed")
    rules: list[str] = []
    for item in raw:
        rule = check_host(item)
        if rule not in rules:
            rules.append(rule)
    return rules
