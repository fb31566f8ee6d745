"""The NATS doors (``natsdoor``) this test process's sandboxes opened: each closes once the loop sees its sandbox
end. A test that runs sandboxes in ``asyncio.run`` waits for that before its loop closes, or the door's socket is
left to the garbage collector (an unclosed-socket warning, failing a later test)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from ember_runtime.agent import netns


def open_doors() -> list[Path]:
    return list((netns.RUN_ROOT / str(os.getpid())).glob("door-*"))


async def until_closed(timeout_s: float = 10.0) -> list[Path]:
    """Until every door of this process is closed (``timeout_s`` at most); those still open."""
    deadline = time.monotonic() + timeout_s
    while open_doors() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return open_doors()
