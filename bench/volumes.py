"""Volumes: how fast a put and a node's fetch move bytes, beside a plain file copy on the same disk, and what a
1 GiB volume costs a replica's start when the node has it cached and when it has not.

What is measured (one run of the embedded platform: nats-server, control plane, node agent on this machine)
    * ``copy``   ``shutil.copyfile`` of a file of random bytes to another file in the same folder (the page cache
                 holds the source, as it does for the put that follows); ``copy + fsync`` the same, written
                 through to the disk
    * ``put``    ``ember.put_volume`` of a fresh file of random bytes (nothing stored yet): read, hashed, sent over
                 HTTP in 8 MiB chunks, hashed again and stored in JetStream's object store, then committed
    * ``fetch``  the node's volume cache (``ember_runtime.agent.volumes.VolumeCache``) fetching that version:
                 each chunk read from the object store, checked, written to its file, made read-only; measured in
                 this process with the control plane's NATS credentials, reading the stores as a control plane
                 does for a node (a node asks a control plane, ``agent.fetch``: the ``start`` rows below
                 include that hop)
    * ``JetStream publish``  what nats-server takes on this machine: 4 MiB messages published one after the
                 other into the chunks' stream, then 4 at a time; and ``JetStream direct get`` what it gives: those
                 messages read back by direct gets, 4 at a time (then purged): the ceilings under put and fetch
    Rounds are interleaved (copy, put, fetch on a new file each round); the table shows medians in MB/s and
    each against the copy. Target: put and fetch at least half the copy's speed.

    * ``start, not cached``  from ``ember push`` of an app mounting a new 1 GiB volume to its replica ready
                             (the node fetches the volume first)
    * ``start, cached``      the same for a second app mounting that same version, now in the node's cache
                             (checked by a stat of its files)

Usage
    python bench/volumes.py [--mb 256] [--repeats 3] [--start-mb 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from ember._client import Transport
from ember._deploy import deploy
from ember._volume import put_volume
from ember.dev.embedded import EmbeddedPlatform
from ember.wire import VolumeMount, subjects
from ember.wire.jetstream import connect, object_stream
from ember_platform.control.node_reads import read_object
from ember_runtime.agent.volumes import VolumeCache, widen_nats_reads

MB = 1024 * 1024
APP = '''import os
import ember
app = ember.App("{app}")

@app.function(volumes={{"/data": ember.Volume("{volume}")}})
def size() -> int:
    return os.path.getsize(os.path.join(ember.mounted("/data"), "blob.bin"))
'''


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def random_file(path: Path, mb: int) -> None:
    with path.open("wb") as fh:
        for _ in range(mb // 4):
            fh.write(os.urandom(4 * MB))


class _Stores:
    """Versions and chunks read straight from the stores, as a control plane reads them for a node."""

    def __init__(self, versions: Any, chunks: Any, js: Any) -> None:
        self._versions, self._chunks, self._js = versions, chunks, js

    async def volume(self, key: str) -> bytes:
        return bytes((await self._versions.get(key)).value or b"")

    async def chunk(self, sha: str) -> bytes:
        return await read_object(self._js, self._chunks, subjects.VOLUME_CHUNKS_STORE, sha)


async def fetch(url: str, creds: object, root: Path, name: str) -> float:
    widen_nats_reads()  # as the node agent does
    nc = await connect(url, "bench-volumes", creds)  # type: ignore[arg-type]
    try:
        js = nc.jetstream()
        cache = VolumeCache(root, _Stores(await js.key_value(subjects.VOLUMES_BUCKET),
                                          await js.object_store(subjects.VOLUME_CHUNKS_STORE), js))
        started = time.perf_counter()
        await cache.ensure(VolumeMount(path="/data", name=name, version=1))
        return time.perf_counter() - started
    finally:
        await nc.close()


async def publish(url: str, creds: object, mb: int, ahead: int = 4) -> dict[str, float]:
    """What nats-server itself takes and gives, MB/s: 4 MiB messages published into the chunks' stream one after
    the other, then ``ahead`` at a time, then read back by direct gets ``ahead`` at a time (then purged)."""
    widen_nats_reads()  # as the node agent does
    nc = await connect(url, "bench-volumes", creds)  # type: ignore[arg-type]
    stream = object_stream(subjects.VOLUME_CHUNKS_STORE)
    try:
        js = nc.jetstream(timeout=60)
        block, subject = os.urandom(4 * MB), f"$O.{subjects.VOLUME_CHUNKS_STORE}.C.bench{uuid.uuid4().hex}"
        started = time.perf_counter()
        for _ in range(mb // 4):
            await js.publish(subject, block)
        one = mb / (time.perf_counter() - started)
        gate = asyncio.Semaphore(ahead)

        async def put() -> int:
            async with gate:
                return (await js.publish(subject, block)).seq

        started = time.perf_counter()
        seqs = await asyncio.gather(*(put() for _ in range(mb // 4)))
        many = mb / (time.perf_counter() - started)

        async def get(seq: int) -> int:
            async with gate:
                return len((await js.get_msg(stream, seq=seq, direct=True)).data or b"")

        started = time.perf_counter()
        got = sum(await asyncio.gather(*(get(seq) for seq in seqs)))
        read = got / MB / (time.perf_counter() - started)
        await js.purge_stream(stream, subject=subject)
        return {"JetStream publish": one, f"JetStream publish, {ahead} at a time": many,
                f"JetStream direct get, {ahead} at a time": read}
    finally:
        await nc.close()


def throughput(plat: EmbeddedPlatform, transport: Transport, work: Path, mb: int,
               repeats: int) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {"copy": [], "copy + fsync": [], "put": [], "fetch": []}
    for i in range(repeats):
        source = work / f"src-{i}" / "blob.bin"
        source.parent.mkdir()
        random_file(source, mb)
        started = time.perf_counter()
        shutil.copyfile(source, work / f"copy-{i}.bin")
        rates["copy"].append(mb / (time.perf_counter() - started))
        os.unlink(work / f"copy-{i}.bin")
        started = time.perf_counter()
        shutil.copyfile(source, work / f"copy-{i}.bin")
        with open(work / f"copy-{i}.bin", "rb+") as fh:
            os.fsync(fh.fileno())
        rates["copy + fsync"].append(mb / (time.perf_counter() - started))
        os.unlink(work / f"copy-{i}.bin")
        for key, rate in asyncio.run(publish(plat.nats_url, plat.nats_credentials, mb)).items():
            rates.setdefault(key, []).append(rate)

        name = f"bench-{uuid.uuid4().hex[:8]}"
        started = time.perf_counter()
        put_volume(name, [source.parent], transport=transport)
        rates["put"].append(mb / (time.perf_counter() - started))

        seconds = asyncio.run(fetch(plat.nats_url, plat.nats_credentials, work / f"cache-{i}", name))
        rates["fetch"].append(mb / seconds)
        shutil.rmtree(work / f"cache-{i}", ignore_errors=True)
        shutil.rmtree(source.parent)
        transport.request("DELETE", f"/v1/volumes/{name}")
        say(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rates.items()) + " MB/s")
    return rates


def starts(transport: Transport, work: Path, mb: int, repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"start, not cached": [], "start, cached": []}
    for i in range(repeats):
        folder = work / f"vol-{i}"
        folder.mkdir()
        random_file(folder / "blob.bin", mb)
        name = f"start-{uuid.uuid4().hex[:8]}"
        put_volume(name, [folder], transport=transport)
        shutil.rmtree(folder)
        apps = []
        for label in ("start, not cached", "start, cached"):
            app = f"vs-{uuid.uuid4().hex[:6]}"
            source = work / app / "app.py"
            source.parent.mkdir()
            source.write_text(APP.format(app=app, volume=name))
            started = time.perf_counter()
            deploy(source, transport=transport, timeout_s=600)
            times[label].append(time.perf_counter() - started)
            apps.append(app)
        for app in apps:
            transport.request("DELETE", f"/v1/apps/{app}")
        say(f"round {i + 1}: push to ready, not cached {times['start, not cached'][-1]:.2f}s, "
            f"cached {times['start, cached'][-1]:.2f}s")
        time.sleep(3)  # the replicas drain before the volume goes
        transport.request("DELETE", f"/v1/volumes/{name}")
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="size of the file put and fetched (MiB)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--start-mb", type=int, default=1024, help="size of the volume a replica mounts (MiB)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ember-bench-volumes-"))
    try:
        with EmbeddedPlatform(work / "state") as plat:
            transport = Transport(plat.url, token=plat.token)
            rates = throughput(plat, transport, work, args.mb, args.repeats)
            times = starts(transport, work, args.start_mb, args.repeats)
            transport.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    copy = statistics.median(rates["copy"])
    print(f"\nvolumes on {platform.node()} ({os.cpu_count()} CPUs), {args.mb} MiB files, {args.repeats} rounds, "
          "medians")
    print(f"  {'':<38} {'MB/s':>8} {'vs copy':>8}")
    for label, values in rates.items():
        median = statistics.median(values)
        print(f"  {label:<38} {median:>8.0f} {median / copy:>8.2f}")
    print(f"\nreplica start with a {args.start_mb} MiB volume (push to ready), {args.repeats} rounds, medians")
    for label, values in times.items():
        print(f"  {label:<38} {statistics.median(values):>7.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
