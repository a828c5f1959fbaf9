"""A task's model gateway, which its broker serves on 127.0.0.1:<port> inside the task's network
namespace (gateway, its HTTP handler): each request given a place in flight (in_flight), its body
read with bounded memory (body) and held to the allowlists (allowlist, request), sent upstream
with the model key the task never sees (key, exchange, upstream), refused in the API's own shape
(messages_api), and its cost reserved before and charged by the usage it reports (usage,
cost_reports). Nothing is imported here: the broker makes the gateway on its first connection,
and aiohttp with it."""
