"""How long a client may take, and how many may hold a connection at once, on every door boxd
listens on: the gateway (127.0.0.1:7700), each task's broker socket, its model gateway and its
egress proxies. One place, so docs/limits.md's table and the code cannot drift apart.

A slow or silent client costs the server a file descriptor and some memory while it hangs on;
these bounds make sure it hangs on for a known time only, and that a crowd of them cannot take
every descriptor of the service or keep a legitimate caller out. What is legitimately long is
never timed: a handler that waits (an /ask or an over-budget /call for the owner, up to
BOX_APPROVAL_WAIT_MS), an event stream (GET /api/events), a model reply streaming, a tunnel
through the egress proxy. Those are bounded in number instead.
"""

from dataclasses import dataclass

# A connection must have sent a whole request head within this long of opening, or of its
# previous answer; an idle keep-alive connection is closed after it too. Local clients send a
# head in milliseconds; aiohttp's client keeps an idle connection 15 s, so it hangs up first.
HEAD_SECONDS = 20.0
# A request's body must have arrived whole within this long of its head: 10 MB (the largest
# body the gateway and broker take) needs 350 KB/s, 32 MiB to the model gateway about 1 MB/s,
# both far below what a local socket carries.
BODY_SECONDS = 30.0
# An answer whose client reads none of it for this long (its window stays shut, the bytes sit
# in the server's buffer) is dropped: the connection is aborted. A client reading, however
# slowly, keeps it.
STALL_SECONDS = 30.0
# How often the limits above are checked: each is kept to within this much.
CHECK_SECONDS = 1.0

# Connections one listener holds at once. At the cap, a new connection takes the place of the
# one that has waited longest without a whole request (nothing sent, a head or a body still
# coming in); when every one is in the middle of a request, the newcomer is answered 503 with
# these words and closed.
GATEWAY_CONNECTIONS = 1024
BROKER_CONNECTIONS = 256
MODEL_GATEWAY_CONNECTIONS = 64
# Through both egress proxies of a task together; each holds two sockets (the task's, the
# upstream's). The one over is answered 503 (HTTP) or closed (SOCKS has no words).
EGRESS_CONNECTIONS = 256
# Connections the kernel queues for a listener before the server accepts them: systemd's own
# default (SOMAXCONN). asyncio listens again on the socket systemd passed, with 100 unless told,
# and a burst beyond that waits for the client's SYN to be sent again, a second or more.
LISTEN_BACKLOG = 4096
# Connections turned away at once: each is answered, then kept for a moment so the answer is
# read before the close (closing with unread bytes sends a reset, which can destroy it). Beyond
# this many they are closed at once, unanswered, so a flood costs no descriptors.
TURNED_AWAY = 64
TURNED_AWAY_SECONDS = 1.0


@dataclass(frozen=True)
class Bounds:
    """The limits above, for one server; tests shorten them."""

    connections: int
    head_seconds: float = HEAD_SECONDS
    body_seconds: float = BODY_SECONDS
    stall_seconds: float = STALL_SECONDS
    check_seconds: float = CHECK_SECONDS
    turned_away: int = TURNED_AWAY
    turned_away_seconds: float = TURNED_AWAY_SECONDS


def busy_words(connections: int) -> str:
    return (
        f"this server has {connections} connections open, every one in the middle of a "
        "request, the most it serves at once: try again in a moment"
    )


def body_words(seconds: float) -> str:
    return (
        f"the request body did not arrive whole within {seconds:g} s of its head; send the "
        "whole body at once"
    )
