"""The doors: the sockets through which callers reach boxd's processes (the gateway, a task's
broker, its egress proxies and model gateway, an app's runner), and how each keeps to its bounds.
How long and how many clients a door holds (connection_limits), what a door does with a
connection over its cap (door_cap), the aiohttp serving that keeps to them (connection_guard),
the sockets systemd passes (socket_activation) and how long a socket-activated process waits
idle (idle_time), answers in the API's shape for every refusal (json_errors, http_refusals),
long answers written page by page (json_pages), a line a caller can cause without end logged at a
pace (paced_log), and systemd's SIGTERM (stopping). aiohttp's only in the modules that name it.
Nothing is imported here: a package's __init__ is loaded by every import of its modules."""
