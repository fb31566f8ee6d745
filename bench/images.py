"""Images: what an environment costs to build, and what an image adds to a push and a replica's first start.

    python bench/images.py [--rounds 5] [--package humanize==4.9.0 ...] [--no-platform]

Part 1 (the node's environment cache, ``EnvCache``, the real uv): per round, interleaved,
- cold: a new cache folder (uv's download and wheel cache empty): lock, then build;
- uv cache warm: the same requirements, a new environment folder, uv's cache kept from earlier rounds;
- reused: the environment is there (what every replica after the first on a node pays).
Without ``--package`` the image is a local wheel of a throwaway package (offline); with it, those packages come
from PyPI (this machine's uv configuration), which shows what uv's cache saves.

Part 2 (a real platform on this machine: nats-server, control plane, one node agent, sandboxes where possible):
per round, interleaved, ``ember.deploy`` of an app with a new image (a pin no earlier round used, so its lock and
environment are new) and of the same app without an image, each until its replica is ready; the wall time of the
push, and the replica's own start (``ready_s``: decision to ready, from its start record).

Prints one table per part, medians over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.wheels import PACKAGE, write_wheel  # noqa: E402

from ember.wire.images import ImageSpec  # noqa: E402
from ember_runtime.agent.envs import EnvCache  # noqa: E402


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:9.1f}" if values else "        -"


async def timed_build(cache: EnvCache, image: ImageSpec) -> tuple[float, float]:
    started = time.perf_counter()
    locked = await cache.lock(image)
    locked_at = time.perf_counter()
    await cache.ensure(locked)
    return locked_at - started, time.perf_counter() - locked_at


def bench_cache(rounds: int, packages: list[str], work: Path) -> None:
    wheels = work / "wheels"
    write_wheel(wheels, version="1.0")
    if packages:
        image = ImageSpec(packages=packages)
    else:
        image = ImageSpec(packages=[f"{PACKAGE}==1.0"], find_links=[str(wheels)], no_index=True)
    warm = EnvCache(work / "warm", local_indexes=[wheels])
    asyncio.run(timed_build(warm, image))  # fills uv's cache once
    rows: dict[str, tuple[list[float], list[float]]] = {"cold": ([], []), "uv cache warm": ([], []),
                                                       "reused": ([], [])}
    for i in range(rounds):
        cold = EnvCache(work / f"cold-{i}", local_indexes=[wheels])
        lock_s, build_s = asyncio.run(timed_build(cold, image))
        rows["cold"][0].append(lock_s)
        rows["cold"][1].append(build_s)
        shutil.rmtree(cold.root, ignore_errors=True)
        for sha in warm.cached():
            shutil.rmtree(warm.root / sha)
        lock_s, build_s = asyncio.run(timed_build(warm, image))
        rows["uv cache warm"][0].append(lock_s)
        rows["uv cache warm"][1].append(build_s)
        locked = asyncio.run(warm.lock(image))
        started = time.perf_counter()
        asyncio.run(warm.ensure(locked))
        rows["reused"][1].append(time.perf_counter() - started)
    what = ", ".join(packages) if packages else f"{PACKAGE}==1.0 (a local wheel)"
    print(f"\nEnvironment of [{what}], {rounds} rounds, medians")
    print(f"| {'case':<14} | {'lock ms':>9} | {'build ms':>9} | {'total ms':>9} |")
    print(f"|{'-' * 16}|{'-' * 11}|{'-' * 11}|{'-' * 11}|")
    for case, (locks, builds) in rows.items():
        totals = [a + b for a, b in zip(locks, builds, strict=True)] if locks else builds
        print(f"| {case:<14} | {median_ms(locks)} | {median_ms(builds)} | {median_ms(totals)} |")
    print("(reused: the environment is found ready; a replica's start pays only this, the lock is made at push)")


APP = '''
import ember
{import_line}
{image_line}
app = ember.App({app!r}{image_arg})


@app.function(min_replicas=1)
def ping() -> str:
    return "pong"
'''


def bench_platform(rounds: int, work: Path) -> None:
    import os

    import ember
    from ember._client import Transport
    from ember._deploy import app_view
    from ember.dev.embedded import EmbeddedPlatform

    wheels = work / "platform-wheels"
    for i in range(rounds + 1):
        write_wheel(wheels, version=f"1.{i}")
    os.environ["EMBER_IMAGE_LOCAL_INDEXES"] = str(wheels)
    results: dict[str, tuple[list[float], list[float]]] = {"new image": ([], []), "no image": ([], [])}
    with EmbeddedPlatform(work / "state") as platform:
        client = Transport(platform.url, token=platform.token)
        for i in range(rounds):
            for case in ("new image", "no image"):
                folder = work / f"app-{case.replace(' ', '-')}-{i}"
                folder.mkdir()
                app = f"bench-img-{i}" if case == "new image" else f"bench-plain-{i}"
                image = (f"image = ember.Image(find_links=[{str(wheels)!r}], no_index=True)"
                         f".pip_install('{PACKAGE}==1.{i}')") if case == "new image" else ""
                (folder / "app.py").write_text(APP.format(
                    import_line=f"import {PACKAGE}" if case == "new image" else "", image_line=image, app=app,
                    image_arg=", image=image" if case == "new image" else ""))
                started = time.perf_counter()
                ember.deploy(folder / "app.py", transport=client, timeout_s=300)
                results[case][0].append(time.perf_counter() - started)
                replica = next(r for s in app_view(client, app).services for r in s.replicas if r.state == "ready")
                if replica.start is not None:
                    results[case][1].append(replica.start.ready_s)
                client.request("DELETE", f"/v1/apps/{app}")
        client.close()
    print(f"\nFirst replica of an app, {rounds} rounds interleaved, medians (one node, this machine)")
    print(f"| {'case':<10} | {'push to ready ms':>16} | {'replica start ms':>16} |")
    print(f"|{'-' * 12}|{'-' * 18}|{'-' * 18}|")
    for case, (pushes, starts) in results.items():
        print(f"| {case:<10} | {median_ms(pushes):>16} | {median_ms(starts):>16} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--package", action="append", default=[], help="a PyPI requirement (repeatable)")
    parser.add_argument("--no-platform", action="store_true", help="only the environment cache")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ember-bench-images-"))
    try:
        bench_cache(args.rounds, args.package, work)
        if not args.no_platform:
            bench_platform(args.rounds, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
