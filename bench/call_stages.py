"""Where a lone call's time goes (``per_call.py --stages``): the NATS hop alone, and each replica alone.

With the platform of ``per_call.py`` running, this process sends, at concurrency 1, interleaved
in blocks of ``BLOCK`` calls back to back per target (the first ``BLOCK_WARMUP`` of each not counted), the targets
in turn and their order reversed each cycle, so that every target sees the same machine:

- frames of one call (``Invocation``, as the gateway's router sends them) straight to each replica's own subject,
  over a NATS connection with the platform's credentials;
- the same bytes to a bare responder (a child process on uvloop that publishes each message back to its reply
  subject, as ``nats_rtt.py`` does) on the same nats-server;
- the HTTP requests of the floor's and Ember's targets, each on its keep-alive connection (``http_latency``).

Their p50s split Ember's p50 at c=1:

- HTTP: the floor's echo (a bare HTTP endpoint);
- model: what the floor's model call adds to the floor's echo (the MLP inline, with its decoding);
- NATS hop: the bare responder's round trip (nats-py on both ends, nats-server twice);
- replica: a replica's round trip minus the hop and the model (its event loop, the frame's decoding, the batcher,
  the hand-over to the model thread, the answer's encoding and publishing);
- gateway: Ember's p50 over HTTP minus the replica's round trip minus the floor's echo (what the gateway adds to a
  bare HTTP endpoint: token, validation, routing, its NATS send and receive).

The gap to the floor is then NATS hop + replica + gateway.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BARE_SUBJECT = "ember.replica.bench-bare.invoke"
BARE_INBOX = "bench.stages.bare"
BLOCK = 25  # calls in a row to one target before the next (back to back, as at c=1: not a cold call each)
BLOCK_WARMUP = 5  # the first calls of a block, not counted (the target was idle while the others ran)
WARMUP_CYCLES = 2


def serve_bare(nats_url: str, auth_dir: str) -> None:
    """The bare responder (run as ``call_stages.py <nats url> <auth dir>``): prints ``ready``, answers forever."""
    from ember import _loop
    from ember_platform.natsauth import keys

    async def main() -> None:
        import nats

        nc = await nats.connect(nats_url, **keys.load(Path(auth_dir)).platform_credentials().connect_options())

        async def echo(msg) -> None:  # type: ignore[no-untyped-def]
            await nc.publish(msg.reply, msg.data)

        await nc.subscribe(BARE_SUBJECT, cb=echo)
        await nc.flush()
        print("ready", flush=True)
        await asyncio.Event().wait()

    _loop.run(main())


async def round_trips(nats_url: str, auth_dir: Path, targets: dict[str, tuple[str, str, bytes]],
                      http: dict[str, Any], calls: int) -> dict[str, float]:
    """p50 ms of each target, interleaved call by call: ``targets``, name -> (subject, function, body), over NATS;
    ``http``, name -> an ``http_latency.Target`` (its first body)."""
    import msgspec
    import nats
    from http_latency import Connection

    from ember.wire import Invocation, answers_decoder, encoder, subjects
    from ember_platform.natsauth import keys

    nc = await nats.connect(nats_url, **keys.load(auth_dir).platform_credentials().connect_options())
    inbox = f"{subjects.answers_inbox('bench')}.percall.stages"  # <inbox>.<app>.<frame>, as the router's
    waiting: dict[str, asyncio.Future[None]] = {}

    async def on_answers(msg) -> None:  # type: ignore[no-untyped-def]
        if msg.subject == BARE_INBOX:  # the bare responder sends the frame back as it came
            waiting.pop("bare").set_result(None)
            return
        for answer in answers_decoder.decode(msg.data):
            if not answer.ack and answer.call_id in waiting:  # a call held a while is acked first: not its answer
                waiting.pop(answer.call_id).set_result(None)

    for subject in (inbox, BARE_INBOX):
        await nc.subscribe(subject, cb=on_answers)
    await nc.flush()
    conns = {name: await Connection.open(t.url, t.token) for name, t in http.items()}
    loop = asyncio.get_running_loop()
    ids = itertools.count()

    async def one(name: str, i: int) -> None:
        if name in conns:
            status, _ = await conns[name].post(http[name].bodies[0])
            if status != 200:
                raise RuntimeError(f"{name} answered {status}")
            return
        subject, function, body = targets[name]
        call_id = "bare" if subject == BARE_SUBJECT else f"s{next(ids)}"
        frame = encoder.encode([Invocation(call_id=call_id, function=function, deadline=time.time() + 30,
                                           input=msgspec.Raw(body))])
        done = waiting[call_id] = loop.create_future()
        await nc.publish(subject, frame, reply=BARE_INBOX if call_id == "bare" else inbox)
        await asyncio.wait_for(done, 30)

    names = [*targets, *http]
    times: dict[str, list[float]] = {name: [] for name in names}
    try:
        for cycle in range(WARMUP_CYCLES + max(calls // BLOCK, 1)):
            for name in names if cycle % 2 == 0 else names[::-1]:
                for i in range(BLOCK):
                    started = time.perf_counter()
                    await one(name, i)
                    if cycle >= WARMUP_CYCLES and i >= BLOCK_WARMUP:
                        times[name].append(time.perf_counter() - started)
    finally:
        for conn in conns.values():
            await conn.close()
        await nc.close()
    return {name: 1000 * sorted(t)[len(t) // 2] for name, t in times.items()}


def measure(nats_url: str, auth_dir: Path, replicas: dict[str, tuple[str, str, bytes]], http: dict[str, Any],
            calls: int) -> dict[str, float]:
    """``replicas``: name -> (replica id, function, body), each measured as ``<name> alone``; ``http``: name -> an
    ``http_latency.Target``. Returns p50 ms by name, and ``NATS hop``."""
    from ember._procs import die_with_parent
    from ember.wire import subjects

    bare = subprocess.Popen([sys.executable, __file__, nats_url, str(auth_dir)], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    try:
        assert bare.stdout is not None
        if bare.stdout.readline().strip() != b"ready":
            raise RuntimeError("the bare responder did not start")
        targets = {f"{name} alone": (subjects.replica_invoke(rid), fn, body)
                   for name, (rid, fn, body) in replicas.items()}
        targets["NATS hop"] = (BARE_SUBJECT, "", next(iter(replicas.values()))[2])
        return asyncio.run(round_trips(nats_url, auth_dir, targets, http, calls))
    finally:
        bare.kill()
        bare.wait()


def render(p50: dict[str, float], floors: dict[str, str], http_floor: str) -> list[list[str]]:
    """The split of each Ember target's p50 (ms). ``floors``: Ember target -> the floor target of the same work;
    ``http_floor``: the floor's echo (HTTP alone)."""
    hop, http = p50["NATS hop"], p50[http_floor]
    rows = [["target", "HTTP (floor echo)", "model (floor)", "NATS hop", "replica", "gateway", "Ember p50",
             "gap to its floor"]]
    for name, floor in floors.items():
        model, alone, ember = p50[floor] - http, p50[f"{name} alone"], p50[name]
        rows.append([name, f"{http:.3f}", f"{model:.3f}", f"{hop:.3f}", f"{alone - hop - model:+.3f}",
                     f"{ember - alone - http:+.3f}", f"{ember:.3f}", f"{ember - p50[floor]:+.3f}"])
    return rows


if __name__ == "__main__":
    serve_bare(sys.argv[1], sys.argv[2])
