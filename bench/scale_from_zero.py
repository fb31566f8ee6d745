"""The first call to a function scaled to zero: woken from a preloaded zygote against a cold start, side by side.

What runs
    One embedded platform. Each round deploys two copies of a trivial class with ``min_replicas=0`` (so neither runs
    a replica), under fresh names: one whose setup is ``@ember.setup(snap=True)`` (the control plane preloads a
    zygote of it on the node its first replica would start on, while the node has room), one whose setup is a plain
    ``@ember.setup`` (no zygote: a cold start). Once the zygote is ready (or ``--zygote-wait-s`` passed: a platform
    that preloads none for an idle function) and the control loop has settled, one synchronous call goes to each, in
    alternating order from round to round; the time of that call (it waits at the gateway while the replica starts)
    is the figure, and the table says how each replica started. Both apps are deleted after the round.

    python bench/scale_from_zero.py [--rounds 5] [--zygote-wait-s 60]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from http_latency import markdown_table, run_interruptible, say  # noqa: E402  (bench/ is not a package)

GOAL_S = 0.15  # a call to a function at zero, with a zygote of it preloaded
APP = '''import ember

app = ember.App({name!r})


@app.model(min_replicas=0, max_replicas=1)
class Nap:
    @ember.setup{snap}
    def load(self) -> None:
        self.ready = True

    @ember.method
    def wake(self, x: int) -> int:
        return x + 1
'''


def _zygote_ready(http: httpx.Client, app: str) -> bool:
    view = http.get("/v1/status", params={"app": app}).json()
    return any(z["app"] == app and z["state"] == "ready" for node in view["nodes"] for z in node["zygotes"])


def _wait(check, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    give_up = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.1)
    return True


def _first_call(http: httpx.Client, app: str) -> tuple[float, str]:
    """Seconds of the call that wakes ``app``, and the kind of start of the replica it woke."""
    started = time.perf_counter()
    response = http.post(f"/v1/{app}/Nap.wake", json=41, timeout=300)
    took = time.perf_counter() - started
    if response.status_code != 200 or response.json() != 42:
        raise SystemExit(f"{app}: {response.status_code} {response.text}")
    [replica] = [r for s in http.get(f"/v1/apps/{app}").json()["services"] for r in s["replicas"]]
    return took, (replica.get("start") or {}).get("kind", "?")


def run(rounds: int, zygote_wait_s: float) -> list[list[str]]:
    from ember._client import Transport
    from ember._deploy import deploy
    from ember.dev.embedded import EmbeddedPlatform

    work = Path(tempfile.mkdtemp(prefix="ember-zero-bench-"))
    platform = EmbeddedPlatform(work / "state", http_port=0)
    took: dict[str, list[float]] = {"zygote": [], "cold": []}
    kinds: dict[str, set[str]] = {"zygote": set(), "cold": set()}
    try:
        platform.start()
        transport = Transport(platform.url, token=platform.token)
        with httpx.Client(base_url=platform.url, headers={"Authorization": f"Bearer {platform.token}"}) as http:
            for r in range(rounds):
                apps = {"zygote": f"nap-snap-{r}", "cold": f"nap-cold-{r}"}
                for kind, app in apps.items():
                    source = work / "apps" / app / f"{app.replace('-', '_')}.py"  # a bundle is the file's folder
                    source.parent.mkdir(parents=True)
                    source.write_text(APP.format(name=app, snap="(snap=True)" if kind == "zygote" else ""))
                    deploy(source, transport=transport, timeout_s=120)
                if not _wait(lambda: _zygote_ready(http, apps["zygote"]), zygote_wait_s):  # noqa: B023
                    say(f"no zygote of {apps['zygote']} after {zygote_wait_s:.0f} s: its first call is measured anyway")
                time.sleep(1.5)  # the control loop settles both at zero
                order = ["zygote", "cold"] if r % 2 == 0 else ["cold", "zygote"]
                for kind in order:
                    seconds, start = _first_call(http, apps[kind])
                    took[kind].append(seconds)
                    kinds[kind].add(start)
                    say(f"round {r + 1}/{rounds}: {kind} {seconds * 1000:.0f} ms ({start} start)")
                for app in apps.values():
                    http.delete(f"/v1/apps/{app}")
        transport.close()
    finally:
        platform.stop()
    rows = [["first call to a function at zero", "median ms", "min ms", "max ms", "starts"]]
    for kind, label in (("zygote", "with a preloaded zygote"), ("cold", "cold (no zygote)")):
        values = [1000 * s for s in took[kind]]
        rows.append([label, f"{statistics.median(values):.0f}", f"{min(values):.0f}", f"{max(values):.0f}",
                     ", ".join(sorted(kinds[kind]))])
    rows.append(["cold / zygote (x)", f"{statistics.median(took['cold']) / statistics.median(took['zygote']):.1f}",
                 "", "", ""])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--zygote-wait-s", type=float, default=60.0,
                        help="how long to wait for the zygote before the calls (a platform that preloads none for "
                             "an idle function: its first call is measured anyway, and says 'cold')")
    args = parser.parse_args()
    rows = run_interruptible(lambda: run(args.rounds, args.zygote_wait_s))
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"{os.uname().nodename} python {sys.version.split()[0]} {when}; goal: a call to a function at zero with "
          f"a zygote preloaded <= {GOAL_S * 1000:.0f} ms")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
