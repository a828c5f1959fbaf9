import pytest

from boxd.errors import BoxError
from boxd.net.hosts import check_host


@pytest.mark.parametrize(
    ("rule", "canonical"),
    [
        ("example.com", "example.com"),
        ("EXAMPLE.com", "example.com"),
        ("*.example.com", "*.example.com"),
        ("*.example.com:8443", "*.example.com:8443"),
        ("example.com:8080", "example.com:8080"),
        ("api.example.co.uk", "api.example.co.uk"),
        ("93.184.216.34", "93.184.216.34"),
        ("[2606:2800:220:1::]:443", "[2606:2800:220:1::]:443"),
        # Private addresses are the owner's to list.
        ("10.0.0.5", "10.0.0.5"),
        ("192.168.1.1:5432", "192.168.1.1:5432"),
        ("[fd00::5]", "[fd00::5]"),
    ],
)
def test_allowed(rule: str, canonical: str) -> None:
    assert check_host(rule) == canonical


@pytest.mark.parametrize(
    ("rule", "why"),
    [
        ("localhost", "is the box itself"),
        ("localhost:80", "is the box itself"),
        ("db.localhost", "is the box itself"),
        ("127.0.0.1", "is a loopback address"),
        ("127.1.2.3:22", "is a loopback address"),
        ("[::1]", "is a loopback address"),
        ("[::ffff:127.0.0.1]:80", "is the IPv4-mapped form of 127.0.0.1, a loopback address"),
        ("169.254.169.254", "is a link-local address"),
        ("[fd00:ec2::254]", "is a cloud metadata service's address"),
        ("100.100.100.200", "is a cloud metadata service's address"),
        ("169.254.1.1", "is a link-local address"),
        ("[fe80::1]", "is a link-local address"),
        ("[::ffff:169.254.1.1]", "is the IPv4-mapped form of 169.254.1.1, a link-local"),
        ("0.0.0.0", "is not the address of one host"),
        ("224.0.0.1", "is a multicast address"),
        ("255.255.255.255", "is the broadcast address"),
        ("com", "is a whole top-level domain"),
        ("*.com", "is a whole top-level domain"),
        ("example.com:0", "has a port that is not a number"),
        ("example.com:99999", "has a port that is not a number"),
        ("example.com:http", "has a port that is not a number"),
        # A digit to str.isdigit, not to int(): a 400 in words, not a failure of boxd's own.
        ("example.com:\u00b2", "has a port that is not a number"),
        ("example.com:\u0663", "has a port that is not a number"),
        ("exa mple.com", "is not a host"),
        ("-bad.com", "is not a host"),
        ("http://example.com", "is a URL or a path, not a host"),
        ("", "is empty"),
        ("*.10.0.0.1", "puts *. before an address"),
    ],
)
def test_refused(rule: str, why: str) -> None:
    with pytest.raises(BoxError) as caught:
        check_host(rule)
    assert why in caught.value.message
    assert caught.value.message.startswith(f"hosts: {rule!r}")
