import pytest

from boxd.errors import BoxError
from boxd.net.egress_target import BadTarget, make_target, parse_authority
from boxd.net.host_rules import HostRules


def refusal(hosts: list[str], target: str) -> str | None:
    return HostRules(hosts).refusal(parse_authority(target))


@pytest.mark.parametrize("target", ["example.com:443", "example.com:80", "EXAMPLE.com.:8080"])
def test_a_name_allows_every_port(target: str) -> None:
    assert refusal(["example.com"], target) is None


def test_a_name_with_a_port_allows_that_port_only() -> None:
    assert refusal(["example.com:8080"], "example.com:8080") is None
    assert refusal(["example.com:8080"], "example.com:443") == (
        "this task's hosts allow example.com on port 8080 only"
    )
    assert refusal(["example.com:8080", "example.com:8443"], "example.com:443") == (
        "this task's hosts allow example.com on ports 8080, 8443 only"
    )


def test_a_wildcard_allows_subdomains_not_the_name_itself() -> None:
    hosts = ["*.example.com"]
    assert refusal(hosts, "a.example.com:443") is None
    assert refusal(hosts, "b.a.example.com:443") is None
    assert refusal(hosts, "example.com:443") == "it is not in this task's hosts"
    assert refusal(hosts, "badexample.com:443") == "it is not in this task's hosts"
    assert refusal(hosts, "example.com.evil.net:443") == "it is not in this task's hosts"


def test_a_wildcard_with_a_port_keeps_it() -> None:
    assert refusal(["*.example.com:8443"], "a.example.com:8443") is None
    assert refusal(["*.example.com:8443"], "a.example.com:443") is not None


def test_an_unlisted_name_is_refused() -> None:
    assert refusal(["example.com"], "example.org:443") == "it is not in this task's hosts"
    assert refusal(["example.com"], "www.example.com:443") == "it is not in this task's hosts"


def test_no_hosts_means_no_network() -> None:
    assert refusal([], "example.com:443") == (
        "this task may not reach the network: its hosts list is empty"
    )


def test_an_ip_address_only_when_listed_as_one() -> None:
    assert refusal(["example.com"], "93.184.216.34:443") == (
        "it is an IP address, and this task's hosts do not list that address"
    )
    assert refusal(["93.184.216.34"], "93.184.216.34:443") is None
    assert refusal(["93.184.216.34:443"], "93.184.216.34:80") is not None


def test_ipv6_literals() -> None:
    hosts = ["[2001:db8::1]:443", "2001:db8::2"]
    assert refusal(hosts, "[2001:0db8:0:0::1]:443") is None
    assert refusal(hosts, "[2001:db8::1]:80") is not None
    assert refusal(hosts, "[2001:db8::2]:22") is None
    assert refusal(hosts, "[2001:db8::3]:443") == (
        "it is an IP address, and this task's hosts do not list that address"
    )
    assert refusal(["example.com"], "[2001:db8::1]:443") is not None


@pytest.mark.parametrize(
    "host",
    ["2130706433", "127.1", "0x7f.1", "exa mple.com", "ex\x00ample.com", "bücher.example.com", ""],
)
def test_what_is_not_a_host_name_is_refused(host: str) -> None:
    target = make_target(host, 443)
    assert not target.valid
    assert HostRules(["*.example.com", "example.com"]).refusal(target) == (
        "it is not a host name or an IP address"
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("example.com", "needs a port, like example.com:443"),
        ("example.com:0", "has a port that is not a number from 1 to 65535"),
        ("example.com:https", "has a port that is not a number from 1 to 65535"),
        ("2001:db8::1:443", "is an IPv6 address without brackets"),
        ("[2001:db8::1", "never closes it"),
        ("[nope]:443", "has no IPv6 address between [ and ]"),
        (":443", "has no host"),
    ],
)
def test_bad_authorities(text: str, why: str) -> None:
    with pytest.raises(BadTarget) as caught:
        parse_authority(text)
    assert why in str(caught.value)


def test_targets_print_as_host_and_port() -> None:
    assert str(parse_authority("Example.COM.:443")) == "example.com:443"
    assert str(parse_authority("[2001:db8:0::1]:443")) == "[2001:db8::1]:443"
    assert str(parse_authority("example.com", default_port=80)) == "example.com:80"


def test_a_bad_rule_fails_in_plain_words() -> None:
    with pytest.raises(BoxError) as caught:
        HostRules(["localhost"])
    assert "tasks never reach localhost" in caught.value.message
