"""A task's way out to the network, as its broker serves it: the HTTP and SOCKS5 proxies on the
sockets systemd binds inside the task's network namespace (proxies, http_proxy, proxy_request,
socks5, socket_reader), each target checked against the task's hosts and the addresses no task
reaches (boxd/net/) and dialled from the broker (dial, connect, own_addresses), the bytes
spliced between the two sockets (pipe), and the refusals logged, coalesced (refusal_log).
Nothing is imported here: the broker makes its proxies on their first connection."""
