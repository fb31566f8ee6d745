"""A fresh replica's tie to its node agent: it outlives the agent's death for a while, not for ever.

The agent hands the replica the read end of a FIFO in its state dir (``LIFELINE_ENV`` names the descriptor) and
holds the write end. While an agent holds it, the FIFO does not hang up; when the agent dies, it does. The replica
then keeps serving (its NATS connection is its own) and waits for a restarted agent to open the FIFO again (it
adopts the replica, see ``ember_runtime.agent.adoption``). If none has within ``NODE_LOST_S`` (when the control
plane counts the node lost and starts its replicas elsewhere), the replica drains and stops, as on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select

from ember.wire.jetstream import NODE_LOST_S

log = logging.getLogger("ember.replica")
LIFELINE_ENV = "EMBER_LIFELINE_FD"
CHECK_EVERY_S = 0.5


def watch(stop: asyncio.Event, env: dict[str, str] | None = None,
          grace_s: float = NODE_LOST_S) -> asyncio.Task[None] | None:
    """A task that sets ``stop`` once the agent has been gone for ``grace_s``; None without a lifeline. The caller
    owns the task (it ends by itself once ``stop`` is set)."""
    raw = (os.environ if env is None else env).get(LIFELINE_ENV, "")
    try:
        fd = int(raw)
        os.set_inheritable(fd, False)  # not to the app's own subprocesses
    except (ValueError, OSError):
        if raw:
            log.warning("%s=%r is not an open descriptor: this replica does not watch its agent", LIFELINE_ENV, raw)
        return None
    return asyncio.create_task(_watch(fd, stop, grace_s), name="agent-lifeline")


def agent_present(fd: int) -> bool:
    """Whether an agent holds the FIFO's write end now (a FIFO whose writers all closed reports a hang-up)."""
    poll = select.poll()
    poll.register(fd, select.POLLHUP)
    return not any(events & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, events in poll.poll(0))


async def _watch(fd: int, stop: asyncio.Event, grace_s: float) -> None:
    loop = asyncio.get_running_loop()
    gone_since: float | None = None
    while not stop.is_set():
        if agent_present(fd):
            if gone_since is not None:
                log.info("a node agent holds this replica again (it was away %.1fs)", loop.time() - gone_since)
            gone_since = None
        elif gone_since is None:
            gone_since = loop.time()
            log.warning("the node agent is gone: serving on; stopping in %.0fs unless an agent adopts this replica",
                        grace_s)
        elif loop.time() - gone_since >= grace_s:
            log.warning("no node agent adopted this replica within %.0fs: it drains and stops", grace_s)
            stop.set()
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), CHECK_EVERY_S)


def exit_with(loop: asyncio.AbstractEventLoop, pid: int, stop: asyncio.Event) -> None:
    """Set ``stop`` (drain) when process ``pid`` exits: a forked replica's tie to its agent (its parent is its
    zygote, so it watches the agent itself). A fresh replica outlives its agent for a while instead (``watch``)."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        log.warning("cannot watch process %d: this replica will not stop with it", pid)
        return
    loop.add_reader(fd, stop.set)
