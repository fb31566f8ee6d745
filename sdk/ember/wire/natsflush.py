"""A NATS flush whose answer covers every command made before it.

nats-py queues a SUB or PUB for its flusher task, but writes a flush's PING straight to the socket: when the flusher
has not run yet (the command was made in the same turn of the loop, or the flusher waits on a full socket), the PING
goes out first and its PONG says nothing of the command. A subscription "flushed" that way can miss what another
connection publishes next (2 to 5 times in a hundred on a loopback server, measured), and a message "flushed" before
the process exits may not have left it.
"""

from __future__ import annotations

from typing import Any

FLUSH_TIMEOUT_S = 10


async def flush(nc: Any, timeout_s: int = FLUSH_TIMEOUT_S) -> None:
    """Hand what ``nc`` holds to its flusher and wait until it is written, then ``nc.flush``: the server has then
    processed every command made on ``nc`` before this call."""
    await nc._flush_pending(force_flush=True)  # no public door to it: the same client's own wait on a full buffer
    await nc.flush(timeout=timeout_s)
