"""What the sandbox costs a replica's start: cold starts and zygote starts, sandboxed and not, in one run.

What is measured
    The node agent's own start paths (``ember_runtime.agent``), without the rest of the platform:

    * ``cold``    a fresh interpreter, as the agent starts a replica (``python -m ember_runtime.hostpid
                  ember_runtime.replica``-style, with the replica's environment): from the start request to
                  the process saying it has imported what a replica imports (``ember_runtime.replica``'s
                  modules and the app's bundle) and knows its pid on the node. Sandboxed: in bwrap, its
                  pid asked of the agent; not: a plain child process.
    * ``zygote``  a replica forked by a zygote built from a bundle with a snap setup: from the agent's fork
                  request to the forked child's answer and its pid on the node (``Zygote.fork``), i.e. what
                  the agent waits for before the replica runs its per-replica setup. Sandboxed: the zygote and
                  its children in bwrap; not: plain processes.

    Runs are interleaved (sandboxed, unsandboxed, sandboxed, ...) so that both see the same machine; the
    table shows medians and the sandboxed/unsandboxed ratio. Target: the sandbox adds under 20 ms to a
    zygote start.

Usage
    python bench/sandbox_start.py [--repeats N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from ember.dev.embedded import nats_server_binary
from ember.wire import ZygoteAssignment
from ember_runtime import hostpid
from ember_runtime.agent import sandbox
from ember_runtime.agent.bundles import make_read_only, remove_tree
from ember_runtime.agent.zygote_pool import Zygote

TARGET_ZYGOTE_MS = 20.0
APP = '''
import ember

app = ember.App("sbx")


@app.model()
class Model:
    @ember.setup(snap=True)
    def load(self) -> None:
        self.weights = [0.0] * 100_000

    @ember.method
    def f(self, x: int) -> int:
        return x
'''
READY = ("import json, os, sys; import ember_runtime.replica.process; sys.path.insert(0, os.getcwd()); "
         "import app; print('ready', flush=True)")


def say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


async def cold_start(node: sandbox.Sandbox, bundle: Path) -> float:
    """Seconds from the start request to the fresh process's ready line."""
    started = time.perf_counter()
    env = sandbox.environment({"EMBER_DEVICE": "cpu"}, sandboxed=node.enabled)
    command = [sys.executable, "-c", f"from ember_runtime import hostpid; hostpid.learn(); {READY}"]
    preexec = partial(sandbox.prepare_child, None)
    hello: asyncio.Task[tuple[bytes, int]] | None = None
    if node.enabled:
        ours, theirs = hostpid.socket_pair()
        env[hostpid.FD_ENV] = str(theirs.fileno())
        proc: asyncio.subprocess.Process | sandbox.SandboxedProcess = await sandbox.start(
            node, command, sandbox.Jail(bundle=bundle), env, preexec, pass_fds=[theirs.fileno()])
        theirs.close()
        hello = asyncio.create_task(hostpid.answer(ours))
    else:
        proc = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE, cwd=bundle, env=env,
                                                    start_new_session=True, preexec_fn=preexec)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 120)
    elapsed = time.perf_counter() - started
    assert line.strip() == b"ready", line
    if hello is not None:
        await hello
        ours.close()
    await proc.wait()
    return elapsed


def start_nats(store: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A bare nats-server with JetStream, for the zygotes' children (a spare may connect before it is asked)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as conn, contextlib.suppress(OSError):
            conn.connect(("127.0.0.1", port))
            return proc, f"nats://127.0.0.1:{port}"
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("nats-server did not start")


async def zygote_starts(node: sandbox.Sandbox, bundle: Path, state: Path, repeats: int, nats_url: str) -> list[float]:
    """Seconds for each of ``repeats`` forks from one zygote."""
    lifeline_r, lifeline_w = os.pipe()
    assignment = ZygoteAssignment(app="sbx", service="Model", version=1, bundle_sha256="0" * 64, module="app")
    state.mkdir(parents=True, exist_ok=True)
    zygote = Zygote(assignment, bundle, state / "z.sock", nats_url, sandbox_=node, lifeline=lifeline_r)
    zygote.start()
    await asyncio.wait_for(zygote.settled.wait(), 180)
    if not zygote.ready:
        raise RuntimeError(f"the zygote did not build: {zygote.message}")
    times = []
    try:
        for _ in range(repeats):
            await asyncio.sleep(0.3)  # the next spare is forked after the answer, off the caller's path
            started = time.perf_counter()
            child = await zygote.fork(["--app", "sbx"], {"EMBER_DEVICE": "cpu"}, None)
            times.append(time.perf_counter() - started)
            os.killpg(child.pid, signal.SIGKILL)
            await child.wait()
    finally:
        await zygote.stop()
        os.close(lifeline_w)
        os.close(lifeline_r)
    return times


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


async def run(repeats: int) -> str:
    node = sandbox.Sandbox.for_node("required")
    plain = sandbox.NO_SANDBOX
    with tempfile.TemporaryDirectory(prefix="ember-sbx-bench-") as tmp:
        bundle = Path(tmp) / "bundle"
        bundle.mkdir()
        (bundle / "app.py").write_text(APP)
        make_read_only(bundle)
        cold: dict[str, list[float]] = {"sandboxed": [], "unsandboxed": []}
        say(f"cold: {repeats} interleaved starts each")
        await cold_start(node, bundle)  # warm the page cache for both
        for _ in range(repeats):
            cold["sandboxed"].append(await cold_start(node, bundle))
            cold["unsandboxed"].append(await cold_start(plain, bundle))
        say(f"zygote: {repeats} forks each, zygotes built in turn, twice")
        forked: dict[str, list[float]] = {"sandboxed": [], "unsandboxed": []}
        nats, url = start_nats(Path(tmp) / "js")
        try:
            for round_ in range(2):
                for name, how in (("sandboxed", node), ("unsandboxed", plain)):
                    forked[name] += await zygote_starts(how, bundle, Path(tmp) / f"{name}-{round_}",
                                                        repeats // 2 or 1, url)
        finally:
            nats.terminate()
            nats.wait()
        remove_tree(bundle)
    return render(cold, forked, repeats)


def render(cold: dict[str, list[float]], forked: dict[str, list[float]], repeats: int) -> str:
    lines = ["| start | sandboxed ms (median) | unsandboxed ms (median) | sandboxed / unsandboxed | added ms |",
             "|---|---:|---:|---:|---:|"]
    for kind, runs in (("cold (fresh interpreter)", cold), ("zygote (fork)", forked)):
        s, u = median_ms(runs["sandboxed"]), median_ms(runs["unsandboxed"])
        lines.append(f"| {kind} | {s:.1f} | {u:.1f} | {s / u:.2f}x | {s - u:+.1f} |")
    added = median_ms(forked["sandboxed"]) - median_ms(forked["unsandboxed"])
    lines += ["", f"{repeats} cold starts and {len(forked['sandboxed'])} zygote forks of each kind; "
                  f"{platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}.",
              f"Target: the sandbox adds under {TARGET_ZYGOTE_MS:g} ms per zygote start: {added:+.1f} ms "
              f"({'met' if added < TARGET_ZYGOTE_MS else 'missed'})."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    print(asyncio.run(run(args.repeats)))


if __name__ == "__main__":
    main()
