"""A task's model gateway, which its broker serves on 127.0.0.1:<port> inside the task's network
namespace: each request held to the allowlists (allowlist, request), sent upstream with the
model key the task never sees (upstream, gateway), and its cost reserved before and charged by
the usage it reports (usage). Nothing is imported here: the broker makes the gateway on its
first connection, and aiohttp with it."""
