"""A fresh replica process started: in its sandbox (its network, its pid on the node learned) or, where the node has
no sandboxes, as a child of the agent in a session of its own. A replica slot starts one this way, and so does a
warm start (``warm_starts``), ahead of the replica that takes it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ember_runtime import hostpid
from ember_runtime.agent import reap, sandbox

log = logging.getLogger("ember.agent")

Started = asyncio.subprocess.Process | sandbox.SandboxedProcess


async def start(command: list[str], env: dict[str, str], preexec: Callable[[], None], out: dict[str, Any],
                keep: Sequence[int], *, confinement: sandbox.Confinement, bundle: Path, name: str,
                hellos: set[asyncio.Task[None]]) -> Started:
    """``command`` started with ``env``; ``keep``: descriptors it inherits (it outlives the agent when there are
    some: see ``ReplicaSlot._pipes``). A sandboxed one asks its pid on the node in a task kept in ``hellos``."""
    if not confinement.sandbox.enabled:
        spawning = asyncio.ensure_future(asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.DEVNULL, cwd=bundle, env=env, start_new_session=True,
            preexec_fn=preexec, pass_fds=keep, **out))
        try:
            return await asyncio.shield(spawning)
        except BaseException:  # a stop cancelled the start: the process may have started all the same
            if (started := await reap.spawned(spawning)) is not None:
                reap.kill_group(started.pid)  # a number just given out, not waited for yet
                await exited(started)
            raise
    ours, theirs = hostpid.socket_pair()
    env[hostpid.FD_ENV] = str(theirs.fileno())
    outlive = dataclasses.replace(confinement.jail(bundle, env), outlive_command=bool(keep))
    try:
        proc = await sandbox.start(confinement.sandbox, command, outlive, env, preexec,
                                   pass_fds=[theirs.fileno(), *keep], **out)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    hello = asyncio.create_task(_learn_host_pid(proc, ours), name=f"host-pid-{name}")
    hellos.add(hello)
    hello.add_done_callback(hellos.discard)
    return proc


async def exited(proc: Any) -> None:
    """Until ``proc``, killed, has exited and its exit been seen (a process the loop never saw exit stays
    unreaped, and its transport open), ``reap.WAIT_S`` at most."""
    try:
        await asyncio.wait_for(proc.wait(), reap.WAIT_S)
    except TimeoutError:
        log.warning("process %d still ran %.0fs after SIGKILL", proc.pid, reap.WAIT_S)


async def _learn_host_pid(proc: sandbox.SandboxedProcess, sock: Any) -> None:
    """Answer the sandboxed process's question (its pid on this node) and remember the answer."""
    try:
        _, proc.host_pid = await asyncio.wait_for(hostpid.answer(sock), hostpid.ASK_TIMEOUT_S)
    except (OSError, TimeoutError):
        pass
    finally:
        sock.close()
