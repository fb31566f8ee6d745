"""Replica starts, cold vs artifact cache vs preloaded zygote, for the digits classifier, in one run.

What is measured
    The time from the node agent's decision to start a replica to the first call that replica answers,
    with the phases the replica records (``StartPhases``: bundle fetch, interpreter, imports, snap setup,
    fork, per-replica setup, ready, first call). Three kinds of start of the same model
    (examples/digits/classifier.py, copied into a temporary folder):

    * ``cold``      new versions of an app the node keeps no warm start for (a bundle the node has never
                    seen): fetch, unpack, a fresh interpreter, imports, all of the setup. The app is a copy
                    whose ``@ember.setup(snap=True)`` is a plain ``@ember.setup``, so no zygote is involved, and
                    with a memory limit of its own (``memory="3GB"``: another sandbox, so another warm start key);
    * ``warm``      new versions of a second copy, for which the node keeps a warm start (``ember_runtime.warm``:
                    an interpreter in the app's sandbox with torch imported, begun ahead): fetch, unpack, the
                    hand-over, the app's import and setup. The agent keeps one warm start (``EMBER_WARM_STARTS=1``),
                    the second copy's key's, whose first version is deployed first; each start waits for it to be
                    ready (it is begun again after each take). The two copies' new versions alternate, each
                    followed by the first start of a new app (a third copy under a new name each time, deleted
                    after: ``warm, first start``), which takes the same key's warm start;
    * ``artifact``  scale-ups of the cold copy by one replica (``POST .../scale``): the bundle is on disk; and
                    scale-ups of the warm copy (``warm``, scale-up);
    * ``zygote``    scale-ups of the example itself (snap setup), each replica forked from the zygote the
                    control plane asked the node to preload; then ``--burst`` replicas added at once (one
                    scale request), after the replica bound had left room for them: the zygote keeps a child
                    forked ahead for each start the scheduler expects on its node (``spares``), so each of
                    them is a hand-over, not a fork on its caller's path.

    An Ember without warm starts (``bench/compare_commits.py`` against an older commit) starts both copies cold.
    A closed-loop caller keeps calling the app being measured (one app at a time: the plain app is deleted
    before the zygote starts are measured), so a new replica gets a call soon after it is ready. The
    decision time is the agent's (``ready_s`` counts from it); the table also shows the time from the
    deploy or scale request to the first served call, which adds the control loop's tick and, for a new
    version, the upload.

    With ``--gpu 8GB`` (a GPU host) every copy asks for 8 GB of a GPU, and each replica copies the weights to its
    GPU and warms up there in its own setup, so every start includes its CUDA context. On a node that sandboxes
    its replicas (the default) the snap app's replicas fork from a zygote whose sandbox holds their GPU's device
    nodes (``ZygoteAssignment.gpus``); an Ember before that keeps no zygote of a GPU service there, and its
    replicas start fresh or warm (the table's kind is what each replica reported).

Usage
    python bench/cold_start.py [--repeats N] [--burst N] [--gpu REQUEST]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from http_latency import auth_headers, run_interruptible, say  # noqa: E402  (bench/ is not a package)

ROOT = BENCH.parent
DIGITS = ROOT / "examples" / "digits"
IMAGE = {"pixels": [0.0] * 64}
TARGET_RATIO = 50.0  # a zygote start at least this many times faster than a cold one
TARGET_ZYGOTE_MS = 30.0  # and at most this, decision to first served call (the median)
TARGET_COLD_S = 1.5  # a start of a new version at most this (the median): a warm one where the node keeps one


@dataclass
class Start:
    kind: str
    how: str  # "new version", "restart", "scale-up"
    phases: dict[str, Any]
    trigger_to_first_call_s: float

    @property
    def decision_to_first_call_s(self) -> float:
        return self.phases["ready_s"] + (self.phases["first_call_s"] or 0.0)


class Caller(threading.Thread):
    """Calls an app's predict in a loop, one call at a time, until stopped."""

    def __init__(self, url: str, app: str) -> None:
        super().__init__(daemon=True)
        self.url, self.app = url, app
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=120, headers=auth_headers()) as client:
            while not self.stop.is_set():
                try:
                    if client.post(f"/v1/{self.app}/Classifier.predict", json=IMAGE).status_code != 200:
                        time.sleep(0.01)  # an app not deployed yet: no storm of 404s while it starts
                except httpx.HTTPError:
                    time.sleep(0.01)


def replicas(url: str, app: str) -> list[dict[str, Any]]:
    view = httpx.get(f"{url}/v1/apps/{app}", timeout=10, headers=auth_headers()).json()
    return [r for s in view["services"] for r in s["replicas"] if r["version"] == view["version"]]


def wait_for(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def new_start(url: str, app: str, old_pids: set[int], trigger_at: float, how: str) -> Start:
    """Wait for a replica that is not one of ``old_pids`` to have answered a call; return its phases."""
    return new_starts(url, app, old_pids, trigger_at, how, 1)[0]


def new_starts(url: str, app: str, old_pids: set[int], trigger_at: float, how: str, count: int) -> list[Start]:
    """Wait for ``count`` replicas that are not of ``old_pids`` to have answered a call; return their phases."""
    def started() -> list[dict[str, Any]] | None:
        answered = [r for r in replicas(url, app) if r["pid"] not in old_pids and r["state"] == "ready" and
                    r.get("start") and r["start"].get("first_call_s") is not None]
        return answered if len(answered) >= count else None

    out = []
    for replica in wait_for(started, 180, f"{count} new replica(s) of {app} to answer"):
        start = replica["start"]
        first_call_at = _decided_at(replica) + start["ready_s"] + start["first_call_s"]
        out.append(Start(start["kind"], how, start, first_call_at - trigger_at))
    return out


def _decided_at(replica: dict[str, Any]) -> float:
    """When the agent decided to start it: its process began (``started_at``, after the exec or the fork)
    that long after the decision, as its phases say."""
    s = replica["start"]
    return replica["started_at"] - s["fetch_s"] - s["interpreter_s"] - s["fork_s"]


def deploy(url: str, app_file: Path, app: str) -> int:
    from ember._client import Transport
    from ember._deploy import deploy as ember_deploy

    transport = Transport(url)
    try:
        return ember_deploy(app_file, app_name=app, transport=transport, timeout_s=180, wait=False).version
    finally:
        transport.close()


def put_weights(url: str) -> None:
    """The classifier's weights: the ``digits-weights`` volume it mounts."""
    from ember._client import Transport
    from ember._volume import put_volume

    transport = Transport(url)
    try:
        put_volume("digits-weights", [DIGITS / "weights.pt"], transport=transport)
    finally:
        transport.close()


def write_apps(folder: Path, gpu: str = "") -> tuple[Path, Path, Path]:
    """The three apps (plain, warm, snap), each in a folder of its own (a bundle is its file's folder: never the
    platform's state); with ``gpu``, each asks for that (``gpu="8GB"``: its replicas share one GPU by memory)."""
    snap_dir = folder / "snap"
    snap_dir.mkdir()
    for name in ("model.py", "schema.py", "weights.pt"):
        shutil.copy(DIGITS / name, snap_dir / name)
    source = (DIGITS / "classifier.py").read_text()
    snap = snap_dir / "classifier.py"
    snap.write_text(source.replace('ember.App("digits")', 'ember.App("cs-snap")'))
    plain = []
    for app in ("cs-plain", "cs-warm"):
        app_dir = folder / app
        app_dir.mkdir()
        for name in ("model.py", "schema.py", "weights.pt"):
            shutil.copy(DIGITS / name, app_dir / name)
        plain.append(app_dir / "classifier.py")
        plain[-1].write_text(source.replace('ember.App("digits")', f'ember.App("{app}")')
                             .replace("@ember.setup(snap=True)", "@ember.setup"))
    plain[0].write_text(plain[0].read_text().replace("@app.model(", '@app.model(memory="3GB", '))  # its own key
    if gpu:
        for path in (*plain, snap):
            path.write_text(path.read_text().replace("@app.model(", f"@app.model(gpu={gpu!r}, "))
    return plain[0], plain[1], snap


def run(repeats: int, burst: int, gpu: str = "") -> None:
    from ember.dev.embedded import EmbeddedPlatform

    work = Path(tempfile.mkdtemp(prefix="ember-coldstart-"))
    os.environ["EMBER_WARM_STARTS"] = "1"  # the node agent's: the first app to ask has it (cs-warm)
    platform = EmbeddedPlatform(work / "state")
    callers: list[Caller] = []
    starts: list[Start] = []
    try:
        plain, warm, snap = write_apps(work, gpu)
        platform.start()
        os.environ["EMBER_TOKEN"] = platform.token  # for the SDK's transport and the raw calls here
        url = platform.url
        put_weights(url)
        say(f"platform at {url}")
        callers = [Caller(url, app) for app in ("cs-warm", "cs-plain", "cs-snap")]
        for app, app_file, caller in (("cs-warm", warm, callers[0]), ("cs-plain", plain, callers[1])):
            deploy(url, app_file, app)
            caller.start()
            wait_for(lambda app=app: [r for r in replicas(url, app) if r["state"] == "ready"], 180, f"{app} ready")
            if app == "cs-warm":
                warm_ready(url, "cs-warm")

        say("cold and warm: new versions of the two copies, alternately")
        for i in range(repeats):
            for app, app_file in (("cs-plain", plain), ("cs-warm", warm)):
                # both kinds on a machine at rest: the warm start begun again after a take has imported torch
                warm_ready(url, "cs-warm")
                old = {r["pid"] for r in replicas(url, app)}
                app_file.write_text(app_file.read_text() + f"\n# new version {i}\n")
                at = time.time()
                deploy(url, app_file, app)
                starts.append(new_start(url, app, old, at, "new version"))
                wait_for(lambda app=app, old=old: not any(r["pid"] in old for r in replicas(url, app)), 60,
                         "the old version to go")
            warm_ready(url, "cs-warm")
            starts.append(first_start(url, warm, f"cs-new-{i}"))

        say("artifact and warm: scale-ups of the two copies (their bundles on disk)")
        for _ in range(repeats):
            warm_ready(url, "cs-warm")
            starts += scale_ups(url, "cs-plain", 1)
            warm_ready(url, "cs-warm")
            starts += scale_ups(url, "cs-warm", 1)

        # Each kind is measured under the same load: its own caller alone.
        for caller in callers[:2]:
            caller.stop.set()
            caller.join(timeout=30)
        for app in ("cs-plain", "cs-warm"):
            httpx.delete(f"{url}/v1/apps/{app}", timeout=30, headers=auth_headers()).raise_for_status()

        deploy(url, snap, "cs-snap")
        callers[2].start()
        try:
            forks = wait_for(lambda: zygote_ready(url, "cs-snap"), 180 if not gpu or not sandboxed(url) else 60,
                             "the zygote")
        except RuntimeError:
            if not gpu:
                raise
            forks = False  # an Ember that keeps no zygote of a GPU service on a node whose sandboxes bind GPUs
        say("zygote: scale-ups of the snap app, forked from the zygote the node preloaded" if forks else
            "the snap app's scale-ups: GPU replicas on a node that sandboxes them start fresh or warm, not forked")
        wait_for(lambda: [r for r in replicas(url, "cs-snap") if r["state"] == "ready"], 180, "a ready replica")
        # on a machine at rest: a warm start its first (fresh) replica asked for has imported torch
        wait_for(lambda: warm_start(url, "cs-snap") != "starting", 180, "cs-snap's warm start, if any, ready")
        starts += scale_ups(url, "cs-snap", repeats)
        if burst and forks:
            say(f"zygote: a burst of {burst} scale-ups of the snap app at once")
            wait_for(lambda: warm_start(url, "cs-snap") != "starting", 180, "cs-snap's warm start, if any, ready")
            starts += burst_up(url, "cs-snap", burst)
        print(render(starts))
        starts = []
    finally:
        if starts:  # stopped early (an error, Ctrl-C, a time limit's SIGINT): what was measured so far
            print(render(starts))
        for caller in callers:
            caller.stop.set()
        platform.stop()
        shutil.rmtree(work, ignore_errors=True)


def first_start(url: str, like: Path, app: str) -> Start:
    """Deploy a copy of ``like`` as app ``app``, new to the node; its first replica's start; the app deleted after."""
    folder = like.parent.with_name(app)
    shutil.copytree(like.parent, folder)
    (folder / like.name).write_text(like.read_text().replace('ember.App("cs-warm")', f'ember.App("{app}")'))
    caller = Caller(url, app)
    caller.start()
    try:
        at = time.time()
        deploy(url, folder / like.name, app)
        return new_start(url, app, set(), at, "first start")
    finally:
        caller.stop.set()
        caller.join(timeout=30)
        httpx.delete(f"{url}/v1/apps/{app}", timeout=30, headers=auth_headers()).raise_for_status()


def warm_start(url: str, app: str, since: float = 0.0) -> str | None:
    """The state of the node's warm start for ``app`` ("" while it has none, or while the node's status is not newer
    than ``since``: a status written before a take still says "ready"); None where the status does not say (an
    Ember before warm starts)."""
    view = httpx.get(f"{url}/v1/status", params={"app": app}, timeout=10, headers=auth_headers()).json()
    if not view["nodes"] or "warm_starts" not in view["nodes"][0]:
        return None
    return next((n["warm_starts"][app] for n in view["nodes"] if app in n["warm_starts"] and n["updated_at"] > since),
                "")


def warm_ready(url: str, app: str) -> None:
    """Wait for a node status written from now on to say the warm start for ``app`` is ready (or that there are
    none)."""
    since = time.time()
    wait_for(lambda: warm_start(url, app, since) in ("ready", None), 180, f"the warm start for {app}")


def sandboxed(url: str) -> bool:
    """Whether the node runs its replicas in sandboxes (``ember status``'s isolation)."""
    view = httpx.get(f"{url}/v1/status", timeout=10, headers=auth_headers()).json()
    return any(n.get("sandbox", "").startswith("bwrap") for n in view["nodes"])


def zygote_ready(url: str, app: str) -> bool:
    view = httpx.get(f"{url}/v1/status", params={"app": app}, timeout=10, headers=auth_headers()).json()
    return any(z["state"] == "ready" for n in view["nodes"] for z in n.get("zygotes", []) if z["app"] == app)


def scale_ups(url: str, app: str, repeats: int) -> list[Start]:
    """Raise the app's replica count by one, ``repeats`` times; each new replica is one start."""
    out = []
    for _ in range(repeats):
        old = {r["pid"] for r in replicas(url, app)}
        at = time.time()
        bounds = {"service": "Classifier", "min_replicas": len(old) + 1, "max_replicas": len(old) + 1}
        httpx.post(f"{url}/v1/apps/{app}/scale", json=bounds, timeout=10, headers=auth_headers()).raise_for_status()
        out.append(new_start(url, app, old, at, "scale-up"))
    return out


def zygote_spares(url: str, app: str) -> int | None:
    """The spares its zygote keeps; None where the status does not say (an Ember before spares)."""
    view = httpx.get(f"{url}/v1/status", params={"app": app}, timeout=10, headers=auth_headers()).json()
    counts = [z.get("spares") for n in view["nodes"] for z in n.get("zygotes", []) if z["app"] == app]
    return counts[0] if counts else None


def burst_up(url: str, app: str, size: int) -> list[Start]:
    """Leave room for ``size`` more replicas (``max_replicas``), give the zygote time to keep a spare for each,
    then raise ``min_replicas`` by ``size`` in one request; each new replica is one start."""
    old = {r["pid"] for r in replicas(url, app)}
    n = len(old)
    scale = f"{url}/v1/apps/{app}/scale"
    room = {"service": "Classifier", "min_replicas": n, "max_replicas": n + size}
    httpx.post(scale, json=room, timeout=10, headers=auth_headers()).raise_for_status()
    wait_for(lambda: zygote_spares(url, app) in (min(size, 4), None), 60, "the zygote's spares")
    time.sleep(1.0)  # its spares forked (one per turn of its loop, milliseconds each)
    at = time.time()
    bounds = {"service": "Classifier", "min_replicas": n + size, "max_replicas": n + size}
    httpx.post(scale, json=bounds, timeout=10, headers=auth_headers()).raise_for_status()
    return new_starts(url, app, old, at, f"burst of {size}", size)


def render(starts: list[Start]) -> str:
    ms = lambda s: f"{s * 1000:,.1f}"  # noqa: E731
    lines = ["| kind | how | decision → first served call ms | fetch | interpreter | imports | snap setup "
             "(in the zygote, before) | fork | setup | ready | first call | trigger → first served call ms |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in starts:
        p = s.phases
        lines.append(f"| {s.kind} | {s.how} | {ms(s.decision_to_first_call_s)} | {ms(p['fetch_s'])} | "
                     f"{ms(p['interpreter_s'])} | {ms(p['imports_s'])} | {ms(p['snap_setup_s'])} | {ms(p['fork_s'])} | "
                     f"{ms(p['setup_s'])} | {ms(p['ready_s'])} | {ms(p['first_call_s'] or 0.0)} | "
                     f"{ms(s.trigger_to_first_call_s)} |")
    one = [s for s in starts if not s.how.startswith("burst")]  # one start per trigger
    medians = {kind: statistics.median(s.decision_to_first_call_s for s in one if s.kind == kind)
               for kind in ("cold", "warm", "artifact", "zygote") if any(s.kind == kind for s in one)}
    lines += ["", "| kind | starts | median decision → first served call ms | cold / this | slowest ms |",
              "|---|---:|---:|---:|---:|"]
    for kind, median in medians.items():
        slowest = max(s.decision_to_first_call_s for s in one if s.kind == kind)
        lines.append(f"| {kind} | {sum(s.kind == kind for s in one)} | {ms(median)} | "
                     f"{medians.get('cold', float('nan')) / median:.1f}x | {ms(slowest)} |")
    if first := [s for s in one if s.how == "first start"]:
        median = statistics.median(s.decision_to_first_call_s for s in first)
        lines.append(f"| first start of a new app | {len(first)} ({'/'.join(sorted({s.kind for s in first}))}) | "
                     f"{ms(median)} | {medians.get('cold', float('nan')) / median:.1f}x | "
                     f"{ms(max(s.decision_to_first_call_s for s in first))} |")
    if burst := [s for s in starts if s.how.startswith("burst")]:
        median = statistics.median(s.decision_to_first_call_s for s in burst)
        lines.append(f"| {burst[0].kind}, {burst[0].how} | {len(burst)} | {ms(median)} | "
                     f"{medians.get('cold', float('nan')) / median:.1f}x | "
                     f"{ms(max(s.decision_to_first_call_s for s in burst))} |")
    if "cold" in medians and "zygote" in medians:
        new_version = [s.decision_to_first_call_s for s in one if s.how == "new version" and s.kind == "warm"]
        ratio, zygote_ms = medians["cold"] / medians["zygote"], medians["zygote"] * 1000
        cold_s = statistics.median(new_version) if new_version else medians["cold"]
        lines += ["", f"Targets: zygote ≥ {TARGET_RATIO:g}x faster than cold: {ratio:.1f}x "
                      f"({'met' if ratio >= TARGET_RATIO else 'missed'}); zygote <= {TARGET_ZYGOTE_MS:g} ms: "
                      f"{zygote_ms:.1f} ms ({'met' if zygote_ms <= TARGET_ZYGOTE_MS else 'missed'}); a new version "
                      f"({'warm' if new_version else 'cold'}) <= {TARGET_COLD_S:g} s: {cold_s:.2f} s "
                      f"({'met' if cold_s <= TARGET_COLD_S else 'missed'})."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="starts of each kind (default 3)")
    parser.add_argument("--burst", type=int, default=3, help="replicas added at once from the zygote (0: none)")
    parser.add_argument("--gpu", default="", metavar="REQUEST",
                        help='on a GPU host: what each app asks for (e.g. "8GB": its replicas share one GPU, the '
                             "weights copied there in each replica's own setup)")
    args = parser.parse_args()
    run_interruptible(lambda: run(args.repeats, args.burst, args.gpu))


if __name__ == "__main__":
    main()
