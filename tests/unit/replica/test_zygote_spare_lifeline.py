"""A zygote's spare (a child forked ahead of a request) leaves when the agent's lifeline closes, even while its
channel to the zygote stays open: before, a spare whose zygote went without closing that channel waited on it for
good, outliving its agent, its sandbox and the test that started them."""

from __future__ import annotations

import contextlib
import os
import time

from ember_runtime.zygote.process import Spare


def _exited(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
        time.sleep(0.05)
    return False


def test_a_waiting_spare_leaves_once_the_lifeline_closes():
    lifeline_r, lifeline_w = os.pipe()
    spare = Spare.fork(None, "nats://127.0.0.1:1", lambda: None, lifeline_r)  # type: ignore[arg-type]
    os.close(lifeline_r)
    try:
        assert not _exited(spare.pid, 0.5)  # it waits for a request while the agent is there
        os.close(lifeline_w)  # the agent is gone; the channel to the spare stays open
        assert _exited(spare.pid, 20), "the spare outlived the lifeline"
    finally:
        spare.close()
        with contextlib.suppress(ProcessLookupError, ChildProcessError):  # not reaped above: it must not linger
            os.kill(spare.pid, 9)
            os.waitpid(spare.pid, 0)
