"""Chaos: a sustained mixed load while the processes Ember runs on are SIGKILLed one after another.

What is measured
    Ember runs on a three-server NATS cluster (every stream and bucket replicated three times), with two control
    planes (one holds the control lease) and one node agent. A load runs for the whole time:

    * synchronous calls (``POST /v1/chaos/echo``) from closed-loop workers, each sending to either control
      plane and moving to the other when one does not answer, as a load balancer would;
    * spawned calls (``POST /v1/chaos/echo/spawn``) at a steady rate, each recorded with its call id;
    * events published to ``events.chaos.in.<n>`` (JetStream-acked, ``Nats-Msg-Id`` set), whose results come back
      on ``events.chaos.out``.

    Every ``--every`` seconds one process is SIGKILLed, in turn: a replica, the node agent, the control plane
    holding the lease, one NATS server of three (``--faults`` picks some of them). What a supervisor would do is
    done too: the agent, the control plane and the NATS server are started again a few seconds later (a killed
    replica is the agent's to restart).

    Reported: per kind of call, how many were accepted, completed, failed with a clear error (an HTTP error
    answer, or a failed record), and lost: accepted but with no outcome at the end (must be 0). A synchronous
    call whose connection broke with no answer is counted apart (its control plane died holding it; the client
    is told by the broken connection). Per fault: the p99 latency of synchronous calls in the ``--every``
    seconds after it (and the slowest), the time until synchronous calls succeeded again, the longest gap between
    two served synchronous calls in that window, and the synchronous calls that failed or broke in it.

Usage
    python bench/chaos.py [--every 20] [--workers 6] [--spawn-rate 20] [--event-rate 20]
                          [--faults replica,agent,control-plane,nats]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the three-server cluster of the tests

from support.nats_cluster import NatsCluster  # noqa: E402
from support.natsconn import connect as nats_connect  # noqa: E402
from support.polling import wait_for  # noqa: E402

from ember._client import Transport  # noqa: E402
from ember._deploy import deploy  # noqa: E402
from ember.wire import subjects  # noqa: E402
from ember_runtime.replica.event_headers import event_scope  # noqa: E402

APP = '''import ember

app = ember.App("chaos")


@app.function(min_replicas=2, max_replicas=2, retries=3, timeout_s=30)
def echo(x: int) -> int:
    return x


@app.function(on="events.chaos.in.>", result_subject="events.chaos.out", min_replicas=1, retries=3)
def event(x: int) -> int:
    return x
'''
ENV = {"EMBER_JS_REPLICAS": "3", "EMBER_ACK_WAIT_S": "5"}
FAULTS = {"replica": "a replica", "agent": "the node agent", "control-plane": "the control plane holding the lease",
          "nats": "one NATS server of three"}


@dataclass
class Tally:
    accepted: int = 0
    completed: int = 0
    failed: int = 0  # a clear error
    broken: int = 0  # sync only: the connection broke without an answer
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (when, seconds) of completed sync calls
    errors: list[float] = field(default_factory=list)  # when each failed or broken sync call was sent
    lock: threading.Lock = field(default_factory=threading.Lock)


class Ember:
    """The cluster, two control planes and one agent, each restartable after a SIGKILL."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cluster = NatsCluster(root / "nats")
        self.urls: dict[str, str] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        self.cluster.start()
        for name in ("cp-a", "cp-b"):
            self.start_control_plane(name)
        self.start_agent()

    def start_control_plane(self, name: str) -> None:
        url_file = self.root / f"{name}.url"
        url_file.unlink(missing_ok=True)
        port = self.urls[name].rsplit(":", 1)[1] if name in self.urls else "0"
        self.procs[name] = self.cluster.spawn(name, ["-m", "ember_platform", "--nats", self.cluster.url,
                                                     "--port", port, "--url-file", str(url_file),
                                                     "--bootstrap-token-file", str(self.root / "token")], ENV)
        self.urls[name] = wait_for(lambda: url_file.exists() and url_file.read_text(), timeout_s=60, what=name)
        os.environ["EMBER_TOKEN"] = (self.root / "token").read_text().strip()  # the admin token, for every call

    def start_agent(self) -> None:
        self.procs["agent"] = self.cluster.spawn("agent", ["-m", "ember_runtime", "--nats", self.cluster.url,
                                                           "--node-id", "chaos-node",
                                                           "--state-dir", str(self.root / "node")], ENV)

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait()

    def stop(self) -> None:
        self.cluster.stop()


def sync_worker(ember: Ember, tally: Tally, stop: threading.Event, offset: int) -> None:
    names = ["cp-a", "cp-b"]
    turn = offset
    with httpx.Client(timeout=30, headers=auth()) as http:
        while not stop.is_set():
            name = names[turn % 2]
            started = time.monotonic()
            try:
                response = http.post(f"{ember.urls[name]}/v1/chaos/echo", json=turn)
            except httpx.HTTPError:
                turn += 1  # that control plane is gone: the other one next
                with tally.lock:
                    tally.broken += 1
                    tally.errors.append(started)
                time.sleep(0.05)
                continue
            with tally.lock:
                tally.accepted += 1
                if response.status_code == 200:
                    tally.completed += 1
                    tally.latencies.append((started, time.monotonic() - started))
                else:
                    tally.failed += 1
                    tally.errors.append(started)
            if response.status_code >= 500 or response.status_code == 429:
                turn += 1
                time.sleep(0.05)


def spawner(ember: Ember, ids: list[str], tally: Tally, stop: threading.Event, rate: float) -> None:
    names = ["cp-a", "cp-b"]
    turn = 0
    with httpx.Client(timeout=30, headers=auth()) as http:
        while not stop.is_set():
            try:
                response = http.post(f"{ember.urls[names[turn % 2]]}/v1/chaos/echo/spawn", json=turn,
                                     headers={"Idempotency-Key": f"chaos-{turn}"})
            except httpx.HTTPError:  # the same key again, on the other control plane: stored once either way
                names.reverse()
                time.sleep(0.05)
                continue
            if response.status_code == 202:
                with tally.lock:
                    tally.accepted += 1
                ids.append(response.json()["call_id"])
                turn += 1
            else:
                names.reverse()
            time.sleep(1 / rate)


async def publisher(url: str, ids: list[str], tally: Tally, stop: threading.Event, rate: float) -> None:
    """Events published with JetStream acks; each accepted one is a call whose record is read at the end (its
    id: ``ev-<scope>-<Nats-Msg-Id>``, see ``ember_runtime.replica.event_headers``)."""
    nc = await nats_connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.5)  # as the control plane
    js = nc.jetstream()
    scope = event_scope(subjects.events_stream("chaos", "event"))
    n = 0
    while not stop.is_set():
        try:
            await js.publish(f"events.chaos.in.{n}", str(n).encode(), headers={"Nats-Msg-Id": f"chaos-ev-{n}"},
                             timeout=5)
        except Exception:
            await asyncio.sleep(0.2)  # not accepted: published again, with the same id
            continue
        with tally.lock:
            tally.accepted += 1
        ids.append(f"ev-{scope}-chaos-ev-{n}")
        n += 1
        await asyncio.sleep(1 / rate)
    await nc.close()


def auth() -> dict[str, str]:
    """The admin token's header (the control planes' bootstrap token, in ``EMBER_TOKEN`` once they run)."""
    return {"Authorization": f"Bearer {os.environ['EMBER_TOKEN']}"}


def replica_pid(url: str) -> int:
    app = httpx.get(f"{url}/v1/apps/chaos", timeout=10, headers=auth()).json()
    pids = [r["pid"] for s in app["services"] if s["name"] == "echo" for r in s["replicas"] if r["state"] == "ready"]
    return pids[0]


def active_control_plane(ember: Ember) -> str:
    for name, url in ember.urls.items():
        if name in ember.procs:
            try:
                if httpx.get(f"{url}/v1/status", timeout=5, headers=auth()).json().get("active"):
                    return name
            except httpx.HTTPError:
                continue
    raise RuntimeError("no control plane holds the lease")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=20.0, help="seconds between faults, and after the last")
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--spawn-rate", type=float, default=20.0)
    parser.add_argument("--event-rate", type=float, default=20.0)
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"which faults, in this order: a comma-separated subset of {','.join(FAULTS)}")
    args = parser.parse_args()
    args.faults = args.faults.split(",")
    if unknown := set(args.faults) - set(FAULTS):
        parser.error(f"--faults: unknown {', '.join(sorted(unknown))}; known: {', '.join(FAULTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        ember = Ember(Path(tmp))
        try:
            return run(ember, Path(tmp), args)
        finally:
            ember.stop()


def run(ember: Ember, tmp: Path, args: argparse.Namespace) -> int:
    print("[chaos] starting a three-server NATS cluster, two control planes and a node agent", file=sys.stderr)
    ember.start()
    (tmp / "app").mkdir()
    (tmp / "app" / "chaos.py").write_text(APP)
    transport = Transport(ember.urls["cp-a"])
    deploy(tmp / "app" / "chaos.py", transport=transport, timeout_s=180)
    transport.close()
    sync, spawned, events = Tally(), Tally(), Tally()
    ids: list[str] = []
    event_ids: list[str] = []
    stop = threading.Event()
    threads = [threading.Thread(target=sync_worker, args=(ember, sync, stop, i), daemon=True)
               for i in range(args.workers)]
    threads.append(threading.Thread(target=spawner, args=(ember, ids, spawned, stop, args.spawn_rate), daemon=True))
    threads.append(threading.Thread(target=lambda: asyncio.run(
        publisher(ember.cluster.url, event_ids, events, stop, args.event_rate)), daemon=True))
    for t in threads:
        t.start()
    time.sleep(args.every)
    faults: list[tuple[str, float]] = []

    def fault(what: str, action) -> None:  # type: ignore[no-untyped-def]
        if what.split(" (")[0] not in [FAULTS[f] for f in args.faults]:
            return
        print(f"[chaos] SIGKILL {what}", file=sys.stderr)
        at = time.monotonic()
        action()
        faults.append((what, at))
        time.sleep(args.every)

    fault("a replica", lambda: os.kill(replica_pid(ember.urls[active_control_plane(ember)]), signal.SIGKILL))

    def agent() -> None:
        ember.kill("agent")
        time.sleep(3)
        ember.start_agent()

    fault("the node agent (started again 3 s later)", agent)

    def control_plane() -> None:
        name = active_control_plane(ember)
        ember.kill(name)
        time.sleep(3)
        ember.start_control_plane(name)

    fault("the control plane holding the lease (started again 3 s later)", control_plane)

    def nats_server() -> None:
        ember.cluster.kill(1)
        time.sleep(3)
        ember.cluster.restart(1)

    fault("one NATS server of three (started again 3 s later)", nats_server)
    stop.set()
    for t in threads:
        t.join(timeout=180)
    print("[chaos] waiting for every accepted spawned call and event to finish", file=sys.stderr)
    settle(ember, ids, spawned)
    settle(ember, event_ids, events)
    report(sync, spawned, events, faults, args.every)
    return 0


def settle(ember: Ember, ids: list[str], tally: Tally) -> None:
    """Wait for every accepted spawned call to reach a final status (long polls), then count them."""
    give_up = time.monotonic() + 180  # what is not final by then is counted lost
    with httpx.Client(timeout=90, headers=auth()) as http:
        for call_id in ids:
            wait = max(0.0, min(60.0, give_up - time.monotonic()))
            for name in ("cp-a", "cp-b"):
                try:
                    record = http.get(f"{ember.urls[name]}/v1/calls/{call_id}", params={"wait": wait}).json()
                    break
                except httpx.HTTPError:
                    continue
            else:
                continue
            if record.get("status") == "succeeded":
                tally.completed += 1
            elif record.get("status") in ("failed", "expired", "cancelled"):
                tally.failed += 1


def report(sync: Tally, spawned: Tally, events: Tally, faults: list[tuple[str, float]], window: float) -> None:
    print("| calls | accepted | completed | failed, clear error | lost | connection broken, no answer |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, t in (("synchronous", sync), ("spawned", spawned), ("events", events)):
        lost = t.accepted - t.completed - t.failed
        broken = str(t.broken) if name == "synchronous" else "-"
        print(f"| {name} | {t.accepted:,} | {t.completed:,} | {t.failed:,} | {lost:,} | {broken} |")
    print()
    print("| fault | sync p99 ms in the window after | max ms | sync p99 ms before any fault | max ms before any fault "
          "| first success after, s | longest gap between served calls, ms | sync calls failed or broken |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    first_fault = faults[0][1] if faults else float("inf")
    calm = [s for at, s in sync.latencies if at < first_fault]
    calm_p99 = _p99(calm)
    calm_max = max((s for at, s in sync.latencies if at + s < first_fault), default=float("nan")) * 1000  # ended
    for what, at in faults:
        during = [s for t, s in sync.latencies if at <= t < at + window]
        recovered = min((t + s for t, s in sync.latencies if t >= at), default=float("nan")) - at
        worst, worst_at = max(((s * 1000, t - at) for t, s in sync.latencies if at <= t < at + window),
                              default=(float("nan"), float("nan")))
        served = sorted(t + s for t, s in sync.latencies if at - window <= t + s < at + window)
        gap, gap_at = max(((b - a, a - at) for a, b in itertools.pairwise(served) if b >= at),
                          default=(float("nan"), float("nan")))
        errors = sum(1 for t in sync.errors if at <= t < at + window)
        print(f"| {what} | {_p99(during):.1f} | {worst:.0f} (at {worst_at:+.2f} s) | {calm_p99:.1f} | {calm_max:.0f} "
              f"| {recovered:.2f} "
              f"| {gap * 1000:.0f} (at {gap_at:+.2f} s) | {errors} |")


def _p99(seconds: list[float]) -> float:
    if not seconds:
        return float("nan")
    if len(seconds) < 2:
        return seconds[0] * 1000
    return statistics.quantiles(seconds, n=100)[98] * 1000


if __name__ == "__main__":
    sys.exit(main())
