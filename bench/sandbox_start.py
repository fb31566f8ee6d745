"""What the sandbox and its own network cost: a replica's start (cold and from a zygote) and a call's NATS hop,
with a network of its own (bwrap --unshare-net, NATS through its door, pasta attached), on the node's network, and
unsandboxed.

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

    * ``call``    a NATS request/reply at concurrency 1 to a responder in the sandbox (nats-py, as a replica
                  answers), p50: what the sandbox's own network adds to each call's NATS hop (its door hands it
                  a plain TCP connection to nats-server: nothing, expected).

    Runs are interleaved (own network, node network, unsandboxed, ...) so that all see the same machine; the
    table shows medians. Targets: the sandbox adds under 20 ms to a zygote start; its own network adds at most
    5 ms to a zygote start and 0.10 ms to a call.

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
TARGET_NETWORK_START_MS = 5.0  # what the sandbox's own network may add to a zygote start
TARGET_NETWORK_CALL_MS = 0.10  # and to a call's p50 at concurrency 1
CALLS = 2000
RESPONDER = """
import asyncio, sys, nats
from ember_runtime import natsdoor
async def main():
    natsdoor.install()  # as a replica connects: through its sandbox's door when it has one
    nc = await nats.connect(sys.argv[1])
    async def echo(msg):
        await msg.respond(msg.data)
    await nc.subscribe("bench.echo." + sys.argv[2], cb=echo)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""
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


async def call_p50(node: sandbox.Sandbox, bundle: Path, nats_url: str, calls: int) -> float:
    """Seconds, p50, of ``calls`` request/replies one at a time to a responder in ``node``'s sandbox."""
    import nats

    name = os.urandom(4).hex()
    command = [sys.executable, "-c", RESPONDER, nats_url, name]
    env = sandbox.environment({}, sandboxed=node.enabled)
    preexec = partial(sandbox.prepare_child, None)
    proc: asyncio.subprocess.Process | sandbox.SandboxedProcess
    if node.enabled:
        proc = await sandbox.start(node, command, sandbox.Jail(bundle=bundle), env, preexec)
    else:
        proc = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE, cwd=bundle, env=env,
                                                    start_new_session=True, preexec_fn=preexec)
    assert proc.stdout is not None
    nc = await nats.connect(nats_url)
    try:
        assert (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() == b"ready"
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            await nc.request(f"bench.echo.{name}", b"x" * 64, timeout=10)
            times.append(time.perf_counter() - started)
    finally:
        await nc.close()
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    return statistics.median(times[calls // 10:])  # the first tenth warms up


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


async def run(repeats: int) -> str:
    with tempfile.TemporaryDirectory(prefix="ember-sbx-bench-") as tmp:
        nats, url = start_nats(Path(tmp) / "js")
        try:
            modes = {"own network": sandbox.Sandbox.for_node("required", nats_url=url),
                     "node network": sandbox.Sandbox.for_node("required"), "unsandboxed": sandbox.NO_SANDBOX}
            if not modes["own network"].own_network:
                raise SystemExit(f"no network of its own here: {modes['own network'].network_why_not}")
            bundle = Path(tmp) / "bundle"
            bundle.mkdir()
            (bundle / "app.py").write_text(APP)
            make_read_only(bundle)
            runs = await measure(modes, bundle, Path(tmp), url, repeats)
            remove_tree(bundle)
        finally:
            nats.terminate()
            nats.wait()
    return render(runs, repeats)


async def measure(modes: dict[str, sandbox.Sandbox], bundle: Path, tmp: Path, url: str,
                  repeats: int) -> dict[str, dict[str, list[float]]]:
    """Each kind of measure, for each mode, interleaved."""
    runs: dict[str, dict[str, list[float]]] = {k: {m: [] for m in modes} for k in ("cold", "zygote", "call")}
    say(f"cold: {repeats} interleaved starts each")
    await cold_start(modes["node network"], bundle)  # warm the page cache for all
    for _ in range(repeats):
        for mode, node in modes.items():
            runs["cold"][mode].append(await cold_start(node, bundle))
    say(f"zygote: {repeats} forks each, zygotes built in turn, twice")
    for round_ in range(2):
        for mode, node in modes.items():
            runs["zygote"][mode] += await zygote_starts(node, bundle, tmp / f"{mode}-{round_}".replace(" ", "-"),
                                                        repeats // 2 or 1, url)
    say(f"call: {CALLS} request/replies at concurrency 1, 3 rounds each")
    for _ in range(3):
        for mode, node in modes.items():
            runs["call"][mode].append(await call_p50(node, bundle, url, CALLS))
    return runs


def render(runs: dict[str, dict[str, list[float]]], repeats: int) -> str:
    lines = ["| measure | own network ms | node network ms | unsandboxed ms | added by own network ms |",
             "|---|---:|---:|---:|---:|"]
    names = {"cold": "cold start (fresh interpreter)", "zygote": "zygote start (fork)", "call": "call p50, c=1"}
    for kind, by_mode in runs.items():
        own, node, plain = (median_ms(by_mode[m]) for m in ("own network", "node network", "unsandboxed"))
        digits = 3 if kind == "call" else 1
        lines.append(f"| {names[kind]} | {own:.{digits}f} | {node:.{digits}f} | {plain:.{digits}f} | "
                     f"{own - node:+.{digits}f} |")
    zygote = median_ms(runs["zygote"]["node network"]) - median_ms(runs["zygote"]["unsandboxed"])
    start = median_ms(runs["zygote"]["own network"]) - median_ms(runs["zygote"]["node network"])
    call = median_ms(runs["call"]["own network"]) - median_ms(runs["call"]["node network"])
    lines += ["", f"{repeats} cold starts, {len(runs['zygote']['unsandboxed'])} zygote forks and 3 x {CALLS} calls "
                  f"per mode; {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}.",
              f"Targets: the sandbox adds under {TARGET_ZYGOTE_MS:g} ms per zygote start: {zygote:+.1f} ms; its own "
              f"network at most {TARGET_NETWORK_START_MS:g} ms: {start:+.1f} ms, and at most "
              f"{TARGET_NETWORK_CALL_MS:g} ms per call: {call:+.3f} ms "
              f"({'met' if zygote < TARGET_ZYGOTE_MS and start <= TARGET_NETWORK_START_MS else 'start missed'}, "
              f"{'met' if call <= TARGET_NETWORK_CALL_MS else 'call missed'})."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    print(asyncio.run(run(args.repeats)))


if __name__ == "__main__":
    main()
