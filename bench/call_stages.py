"""Where a lone call's time goes (``per_call.py --stages``): the NATS hop alone, and each replica alone.

With the platform of ``per_call.py`` running, a NATS client of this process (the platform's credentials) sends
frames of one call (``Invocation``, as the gateway's router does) straight to each replica's own subject, and the
same bytes to a bare responder (a child process on uvloop that publishes each message back to its reply subject,
as ``nats_rtt.py`` does) on the same nats-server: concurrency 1, the targets interleaved call by call (their order
turns each cycle), so that all of them see the same machine. Their p50s split Ember's p50 at c=1:

- NATS hop: the bare responder's round trip (nats-py on both ends, nats-server twice);
- model: what the floor's model call adds to the floor's echo (the MLP inline, with its decoding);
- replica: a replica's round trip minus the hop and the model (its event loop, the frame's decoding, the batcher,
  the hand-over to the model thread, the answer's encoding and publishing);
- gateway: Ember's p50 over HTTP minus the replica's round trip minus the floor's echo (what the gateway adds to a
  bare HTTP endpoint: token, validation, routing, its NATS send and receive).

The gap to the floor is then NATS hop + replica + gateway. On a shared machine the split is as noisy as the p50s it
is made of; read it within one run.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

BARE_SUBJECT = "ember.replica.bench-bare.invoke"


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
                      calls: int) -> dict[str, float]:
    """p50 ms of each target, ``name -> (subject, function, body)``, interleaved call by call."""
    import msgspec
    import nats

    from ember.wire import Invocation, encoder, subjects
    from ember_platform.natsauth import keys

    nc = await nats.connect(nats_url, **keys.load(auth_dir).platform_credentials().connect_options())
    inbox = f"{subjects.answers_inbox('bench')}.percall.stages"  # <inbox>.<app>.<frame>, as the router's
    answered: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_answer(msg) -> None:  # type: ignore[no-untyped-def]
        answered.put_nowait(msg.data)

    await nc.subscribe(inbox, cb=on_answer)
    await nc.flush()
    names = list(targets)
    times: dict[str, list[float]] = {name: [] for name in names}
    warmup = 200
    for i in range(warmup + calls):
        order = names if i % 2 == 0 else names[::-1]
        for name in order:
            subject, function, body = targets[name]
            frame = encoder.encode([Invocation(call_id=f"s{i}", function=function, deadline=time.time() + 30,
                                               input=msgspec.Raw(body))])
            started = time.perf_counter()
            await nc.publish(subject, frame, reply=inbox)
            await answered.get()
            if i >= warmup:
                times[name].append(time.perf_counter() - started)
    await nc.close()
    return {name: 1000 * sorted(t)[len(t) // 2] for name, t in times.items()}


def measure(nats_url: str, auth_dir: Path, replicas: dict[str, tuple[str, str, bytes]], calls: int) -> dict[str, float]:
    """``replicas``: target name -> (replica id, function, body). Returns p50 ms by target name, and ``NATS hop``."""
    from ember._procs import die_with_parent
    from ember.wire import subjects

    bare = subprocess.Popen([sys.executable, __file__, nats_url, str(auth_dir)], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    try:
        assert bare.stdout is not None
        if bare.stdout.readline().strip() != b"ready":
            raise RuntimeError("the bare responder did not start")
        targets = {name: (subjects.replica_invoke(rid), fn, body) for name, (rid, fn, body) in replicas.items()}
        targets["NATS hop"] = (BARE_SUBJECT, "", next(iter(replicas.values()))[2])
        return asyncio.run(round_trips(nats_url, auth_dir, targets, calls))
    finally:
        bare.kill()
        bare.wait()


def render(p50: dict[str, float], http_ms: float, model_ms: dict[str, float], ember: dict[str, float]
           ) -> list[list[str]]:
    """The split of each target's Ember p50 (ms): ``http_ms`` the floor's echo (HTTP alone), ``model_ms`` what the
    floor's model adds to it (its MLP p50 minus its echo p50), ``ember`` Ember's p50 over HTTP, by target."""
    hop = p50["NATS hop"]
    rows = [["target", "HTTP (floor echo)", "model (floor)", "NATS hop", "replica", "gateway", "Ember p50",
             "gap to its floor"]]
    for name, alone in p50.items():
        if name == "NATS hop":
            continue
        model = model_ms[name]
        rows.append([name, f"{http_ms:.3f}", f"{model:.3f}", f"{hop:.3f}", f"{alone - hop - model:+.3f}",
                     f"{ember[name] - alone - http_ms:+.3f}", f"{ember[name]:.3f}",
                     f"{ember[name] - http_ms - model:+.3f}"])
    return rows


if __name__ == "__main__":
    serve_bare(sys.argv[1], sys.argv[2])
