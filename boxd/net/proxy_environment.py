"""The environment that points a worker's programs at its egress proxies.

ALL_PROXY says socks5h, not socks5: with socks5 curl and others resolve the name themselves
first, and the task has no DNS, so every such request would fail before reaching the proxy.
NO_PROXY names loopback only, where the task's own model gateway and servers are.
"""

NO_PROXY = "localhost,127.0.0.1,::1"


def proxy_environment(http_port: int, socks_port: int, host: str = "127.0.0.1") -> dict[str, str]:
    http = f"http://{host}:{http_port}"
    names = {
        "HTTP_PROXY": http,
        "HTTPS_PROXY": http,
        "ALL_PROXY": f"socks5h://{host}:{socks_port}",
        "NO_PROXY": NO_PROXY,
    }
    return {**names, **{name.lower(): value for name, value in names.items()}}
