"""Idle cost against the number of apps: 1, 100 and 1,000 apps at zero replicas, nothing called.

What it does
    Starts an embedded platform (nats-server, control plane, node agent) and deploys apps made of one trivial
    function with ``min_replicas=0`` (bench/apps/idle/idle.py), so that none of them runs a replica. The app is
    inspected and its bundle uploaded once (``PUT /v1/bundles/<sha>``, as ``ember push`` does); every app is then
    deployed through the product's own deploy route, ``POST /v1/apps/<name>/deployments``, with that manifest
    renamed (``idle0000``, ``idle0001``, ...), 8 requests at a time: ``ember push`` per app would inspect the same
    file and upload the same bundle a thousand times. At each count (``--counts``, default 1, 100, 1000) it
    waits ``--settle-s`` seconds, then measures, with no traffic:

    - the CPU of each process (control plane, agent, nats-server) over ``--window-s`` seconds, from
      ``/proc/<pid>/stat``, as a share of one core (0.1 % is one clock tick over a 10 s window);
    - ``ember ls``: the CLI command itself (a fresh interpreter) and its request alone (``GET /v1/apps``), medians
      of ``--repeats``;
    - ``GET /metrics``, median of ``--repeats``.

    It prints one markdown table; the goal (platform idle CPU at most 2 % of a core, whatever the number of idle
    apps) is printed beside it. Nothing is asserted. ``--profile DIR`` adds a py-spy profile of the control plane
    over the window at the largest count.

Usage
    python bench/idle_scale.py [--counts 1,100,1000] [--window-s 10] [--settle-s 5] [--repeats 5] [--profile DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from batching import proc_cpu_s, py_spy_binary  # noqa: E402
from http_latency import auth_headers, markdown_table, run_interruptible, say  # noqa: E402

APP_FILE = BENCH / "apps" / "idle" / "idle.py"


def deployer(url: str):  # type: ignore[no-untyped-def]
    """Upload the idle app's bundle once; return a function that deploys it as the app ``name``."""
    import httpx
    import msgspec

    from ember._bundle import build_bundle
    from ember._deploy import plan_images
    from ember.wire import DeployRequest, encoder

    found = plan_images(APP_FILE, None)
    assert found.manifest is not None and not found.images
    bundle = build_bundle(APP_FILE.parent)
    headers = auth_headers()
    httpx.put(f"{url}/v1/bundles/{bundle.sha256}", content=bundle.data, timeout=60,
              headers=headers | {"content-type": "application/gzip"}).raise_for_status()
    client = httpx.Client(timeout=60, headers=headers | {"content-type": "application/json"},
                          limits=httpx.Limits(max_connections=16))

    def deploy(name: str) -> None:
        manifest = msgspec.structs.replace(found.manifest, app=name)
        body = encoder.encode(DeployRequest(bundle_sha256=bundle.sha256, manifest=manifest))
        client.post(f"{url}/v1/apps/{name}/deployments", content=body).raise_for_status()

    return deploy


def cpu_shares(roles: dict[str, int], seconds: float) -> dict[str, float]:
    before = {name: proc_cpu_s(pid) or 0.0 for name, pid in roles.items()}
    start = time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - start
    return {name: 100 * ((proc_cpu_s(pid) or 0.0) - before[name]) / wall for name, pid in roles.items()}


def get(url: str) -> None:
    import httpx

    httpx.get(url, headers=auth_headers(), timeout=60).raise_for_status()


def median_s(action, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(args: argparse.Namespace) -> None:
    from ember.dev.embedded import EmbeddedPlatform

    work = Path(tempfile.mkdtemp(prefix="ember-bench-idle-"))
    platform = EmbeddedPlatform(work / "state", http_port=0)
    keep_logs = False
    try:
        say(f"starting the platform in {platform.state_dir}")
        platform.start()
        os.environ["EMBER_TOKEN"] = platform.token
        url = platform.url
        roles = {"control plane": platform._procs["platform"].pid, "agent": platform._procs["agent"].pid,
                 "nats-server": platform._procs["nats"].pid}
        deploy = deployer(url)
        env = os.environ | {"EMBER_URL": url, "EMBER_TOKEN": platform.token}
        ls_cmd = [sys.executable, "-m", "ember.cli", "ls"]
        rows = [["apps", *(f"{r} % core" for r in roles), "sum % core", "ember ls ms", "GET /v1/apps ms",
                 "GET /metrics ms", "deploy s"]]
        deployed = 0
        for count in args.counts:
            started = time.perf_counter()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(deploy, [f"idle{i:04d}" for i in range(deployed, count)]))
            deploy_s = time.perf_counter() - started
            deployed = count
            say(f"{count} apps deployed in {deploy_s:.1f} s; settling {args.settle_s:g} s")
            time.sleep(args.settle_s)
            spy = None
            if args.profile is not None and count == args.counts[-1]:
                args.profile.mkdir(parents=True, exist_ok=True)
                spy = subprocess.Popen([py_spy_binary() or "py-spy", "record", "--pid", str(roles["control plane"]),
                                        "--duration", str(int(args.window_s)), "--rate", "100", "--format",
                                        "speedscope", "--nonblocking", "--output",
                                        str(args.profile / f"idle-control-plane-{count}.json")],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            say(f"idle CPU over {args.window_s:g} s")
            shares = cpu_shares(roles, args.window_s)
            if spy is not None:
                spy.wait(60)
            apps_s = median_s(lambda: get(f"{url}/v1/apps"), args.repeats)
            metrics_s = median_s(lambda: get(f"{url}/metrics"), args.repeats)
            ls_s = median_s(lambda: subprocess.run(ls_cmd, env=env, check=True, stdout=subprocess.DEVNULL,
                                                   timeout=120), args.repeats)
            rows.append([f"{count:,}", *(f"{shares[r]:.2f}" for r in roles), f"{sum(shares.values()):.2f}",
                         f"{1000 * ls_s:.0f}", f"{1000 * apps_s:.1f}", f"{1000 * metrics_s:.1f}", f"{deploy_s:.1f}"])
            say(" | ".join(rows[-1]))
        print(f"## Idle cost against the number of apps at zero replicas ({os.cpu_count()} CPUs; "
              f"{args.window_s:g} s windows, medians of {args.repeats})\n")
        print(markdown_table(rows))
        print("\ngoal: control plane + agent + nats-server at most 2 % of a core, whatever the number of idle apps")
    except BaseException:
        keep_logs = True
        raise
    finally:
        say("stopping")
        platform.stop()
        if keep_logs:
            say(f"logs kept in {platform.log_dir}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=lambda s: [int(x) for x in s.split(",")], default=[1, 100, 1000])
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", type=Path, metavar="DIR", help="py-spy the control plane at the largest count")
    args = parser.parse_args()
    if sorted(args.counts) != args.counts or args.counts[0] < 1:
        parser.error("--counts: increasing whole numbers from 1")
    run_interruptible(lambda: run(args))


if __name__ == "__main__":
    main()
