"""The environment that points a worker's programs at its egress proxies.

HTTP clients get the HTTP proxy under the names they read by themselves (HTTP_PROXY and
HTTPS_PROXY, in both cases: curl and git read http_proxy in lower case only), with NO_PROXY for
loopback, where the task's own model gateway and servers are.

The SOCKS proxy is offered as BOX_SOCKS_PROXY, a name no client reads unasked, and not as
ALL_PROXY: httpx (under Anthropic's and OpenAI's SDKs and most Python agents) builds a
transport for every proxy variable when a client is made, and for a socks5h:// one it needs the
optional socksio package, so `Anthropic()` died with an ImportError before sending anything, even
to the gateway NO_PROXY covers; reqwest reads ALL_PROXY too. Every HTTP client is served by the
HTTP proxy; what speaks another protocol over TCP (ssh, a database) is pointed at the SOCKS proxy
by hand (`curl -x "$BOX_SOCKS_PROXY"`, `nc -X 5 -x 127.0.0.1:1080`). It says socks5h, not socks5:
with socks5 curl and others resolve the name themselves first, and the task has no DNS.

NODE_USE_ENV_PROXY=1 has Node.js (24, and 22.21 on) send fetch() and its http modules through
HTTP(S)_PROXY, which it ignores otherwise; older Node reads no proxy variable at all
(docs/agents.md says what to do there).
"""

NO_PROXY = "localhost,127.0.0.1,::1"
# The SOCKS5 proxy's variable: no client reads it unless told to.
SOCKS_VARIABLE = "BOX_SOCKS_PROXY"


def proxy_environment(http_port: int, socks_port: int, host: str = "127.0.0.1") -> dict[str, str]:
    http = f"http://{host}:{http_port}"
    names = {"HTTP_PROXY": http, "HTTPS_PROXY": http, "NO_PROXY": NO_PROXY}
    return {
        **names,
        **{name.lower(): value for name, value in names.items()},
        SOCKS_VARIABLE: f"socks5h://{host}:{socks_port}",
        "NODE_USE_ENV_PROXY": "1",
    }
