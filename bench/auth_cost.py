"""The cost of the token check on the call path: the same calls through a control plane that checks tokens and
through one that does not (``--insecure-no-auth``, on loopback), in the same run.

What is measured
    * the check itself, in this process: ``TokenStore.authenticate`` of an ``Authorization`` header and the scope
      and app check, the work the gateway adds to every call (microseconds per check);
    * ``hello.echo`` over HTTP (examples/hello/hello.py) through each of the two control planes: p50 latency at
      concurrency 1 and requests/s at concurrency 64, the same closed-loop load generator as
      ``bench/http_latency.py``.

How
    One ``EmbeddedPlatform`` (nats-server, a control plane, a node agent) in a temporary directory, and two more
    control planes on its NATS, started the same way as the first but with ``--port 0``: one with the platform's
    bootstrap token file (tokens checked), one with ``--insecure-no-auth`` (nothing checked). Both are standbys
    of the control loop, so that neither carries it; the same replicas answer both. The calls through the checking
    one send an ``invoke`` token limited to ``hello``. Rounds alternate the two, in alternating order; the table
    gives each one's median over the rounds and their ratio.

    With ``--same`` neither control plane checks tokens (an A/A run): what remains between the two columns is
    the two processes' own difference on this machine, the resolution of the comparison.

Usage
    python bench/auth_cost.py [--rounds N] [--quick] [--same]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from ab import ab_table, measure_rounds, start_control_plane  # noqa: E402  (bench/ is not a package)
from http_latency import (  # noqa: E402
    FULL,
    QUICK,
    Plan,
    Target,
    deploy_examples,
    run_interruptible,
    say,
    stop_process,
)

ECHO_BODY = [json.dumps({"message": "hello", "n": 42}).encode()]
CHECKS = 200_000


def check_cost_us() -> float:
    """Microseconds per token check (authenticate the header, then the scope and app check), in this process."""
    from ember.wire import StoredToken, TokenInfo
    from ember.wire.tokens import new_token, parse_token, secret_digest
    from ember_platform.auth.tokens import TokenStore

    store = TokenStore(None)  # type: ignore[arg-type]  # its mirror is filled by hand, never started
    for i in range(1000):  # a store of a thousand tokens
        token = new_token()
        token_id, secret = parse_token(token) or ("", "")
        store.mirror.items[token_id] = StoredToken(
            info=TokenInfo(id=token_id, name=f"t{i}", scopes=["invoke"], apps=["hello", "team-*"], created_at=0.0),
            secret_sha256=secret_digest(secret))
    header = f"Bearer {token}"
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(CHECKS):
            store.authenticate(header).require("invoke", "hello")
        best = min(best, (time.perf_counter() - started) / CHECKS * 1e6)
    return best


def invoke_token(url: str, admin: str) -> str:
    import httpx

    response = httpx.post(f"{url}/v1/tokens", json={"scopes": ["invoke"], "apps": ["hello"], "name": "bench"},
                          headers={"Authorization": f"Bearer {admin}"}, timeout=30)
    response.raise_for_status()
    return str(response.json()["token"])


def render(results: dict[str, list[float]], check_us: float, rounds: int, same: bool) -> str:
    check = ["check alone, in process (us)", f"{check_us:.2f}", "0", f"{check_us:+.2f}", "-"]
    return ab_table(results, rounds, "first, no check (A/A)" if same else "tokens checked", "no check",
                    before=[check])


def run(rounds: int, plan: Plan, same: bool) -> None:
    from ember.dev.embedded import EmbeddedPlatform

    work = Path(tempfile.mkdtemp(prefix="ember-auth-bench-"))
    platform = EmbeddedPlatform(work / "state", http_port=0)
    planes: list[subprocess.Popen[bytes]] = []
    keep = False
    try:
        say("the token check alone")
        check_us = check_cost_us()
        say(f"starting the platform in {work}")
        platform.start()
        deploy_examples(platform.url, platform.token, ("examples/hello/hello.py",))
        first = platform._procs["platform"]
        on, on_url = start_control_plane(first, work, "checked", *(
            ("--insecure-no-auth",) if same else ("--bootstrap-token-file", str(platform.state_dir / "token"))))
        off, off_url = start_control_plane(first, work, "unchecked", "--insecure-no-auth")
        planes += [on, off]
        token = "" if same else invoke_token(on_url, platform.token)
        checked = Target("tokens on", f"{on_url}/v1/hello/echo", ECHO_BODY, is_ember=True, token=token)
        unchecked = Target("tokens off", f"{off_url}/v1/hello/echo", ECHO_BODY, is_ember=True)
        print(render(measure_rounds(checked, unchecked, rounds, plan, "tokens"), check_us, rounds, same))
    except Exception:
        keep = True
        raise
    finally:
        say("stopping")
        for proc in planes:
            stop_process(proc)
        platform.stop()
        if keep:
            say(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of both (default 5)")
    parser.add_argument("--quick", action="store_true", help="shorter windows, for a smoke run")
    parser.add_argument("--same", action="store_true",
                        help="an A/A run: neither control plane checks tokens, to see how much two processes running "
                             "the same code differ here")
    args = parser.parse_args()
    run_interruptible(lambda: run(args.rounds, QUICK if args.quick else FULL, args.same))


if __name__ == "__main__":
    main()
