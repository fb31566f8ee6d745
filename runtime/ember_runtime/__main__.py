"""``python -m ember_runtime``: run a node agent until SIGTERM or SIGINT, then drain its replicas."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

from ember import _logging
from ember import _loop as ember_loop
from ember.wire.natscreds import CREDS_FILE_ENV, CredentialsError, read_file
from ember_runtime.agent import builder, gpu_faults
from ember_runtime.agent.adoption import Records
from ember_runtime.agent.node import NodeAgent
from ember_runtime.agent.sandbox import Sandbox, SandboxUnavailable
from ember_runtime.agent.slots import STOP_GRACE_S
from ember_runtime.agent.warm_starts import DEFAULT_LIMIT


def _grace(text: str) -> float:
    """``--stop-grace-s``: seconds, more than 0 and at most an hour."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < seconds <= 3600:
        raise argparse.ArgumentTypeError(f"{text} is not more than 0 and at most 3600 seconds")
    return seconds


def _whole(most: int) -> Callable[[str], int]:
    """An option's parser: a whole number from 0 to ``most``, anything else argparse's error naming the option."""
    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit()) or int(text) > most:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number from 0 to {most}")
        return int(text)

    return parse


def _xids(text: str) -> frozenset[int] | None:
    try:
        return gpu_faults.ignored_xids(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main() -> None:
    parser = argparse.ArgumentParser(prog="ember_runtime", description="Ember node agent")
    parser.add_argument("--nats", default=os.environ.get("EMBER_NATS_URL", "nats://127.0.0.1:4222"))
    parser.add_argument("--state-dir", type=Path, default=Path(os.environ.get("EMBER_STATE_DIR", ".ember/node")))
    parser.add_argument("--node-id", default=None)
    parser.add_argument("--inventory", type=Path, default=os.environ.get("EMBER_INVENTORY") or None,
                        help="a declared (virtual) inventory file instead of this machine's GPUs")
    parser.add_argument("--nats-creds", type=Path, default=os.environ.get(CREDS_FILE_ENV) or None,
                        help="this node's NATS credentials file, mode 0600 (`python -m ember_platform.natsauth "
                             f"node-creds`; default: ${CREDS_FILE_ENV})")
    parser.add_argument("--log-format", choices=_logging.FORMATS, default=_logging.default_format(),
                        help=f"text lines, or one JSON object per line (${_logging.FORMAT_ENV})")
    parser.add_argument("--sandbox-network", choices=("own", "node"),
                        default=os.environ.get("EMBER_SANDBOX_NETWORK") or "own",
                        help="own (default): every sandbox in a network namespace of its own, reaching NATS "
                             "(through a socket the agent connects) and the internet (pasta) only; node: sandboxes "
                             "share the node's network, except block_network=True functions' "
                             "($EMBER_SANDBOX_NETWORK)")
    parser.add_argument("--insecure-no-auth", action="store_true",
                        help="connect to NATS without credentials (a nats-server that checks none): refused without "
                             "this flag, since such a server lets any client read and write everything")
    parser.add_argument("--stop-grace-s", type=_grace, default=os.environ.get("EMBER_STOP_GRACE_S") or STOP_GRACE_S,
                        help="when the agent stops (SIGTERM), how long each replica may take to finish the calls it "
                             "runs before it is killed (their calls are then delivered again); 0 < seconds <= 3600 "
                             f"(default {STOP_GRACE_S:g}, $EMBER_STOP_GRACE_S)")
    parser.add_argument("--warm-starts", type=_whole(64), default=os.environ.get("EMBER_WARM_STARTS") or DEFAULT_LIMIT,
                        help="apps whose next fresh replica starts from a warm start (an interpreter in the app's "
                             "sandbox with its heavy libraries imported ahead), at most; each holds the memory of "
                             f"those imports; 0: none (default {DEFAULT_LIMIT}, $EMBER_WARM_STARTS)")
    parser.add_argument("--build-memory-mb", type=_whole(1024 * 1024),
                        default=os.environ.get("EMBER_BUILD_MEMORY_MB") or str(builder.MEMORY_MB),
                        help="memory a push's import of its app may use on this node, where the app's manifest is "
                             "read (a cgroup's memory.max where the node delegates the memory controller, else "
                             f"RLIMIT_DATA); 0: no limit (default {builder.MEMORY_MB}, $EMBER_BUILD_MEMORY_MB)")
    parser.add_argument("--ignore-xids", type=_xids, default=os.environ.get("EMBER_IGNORE_XIDS", ""),
                        help="Xid errors that leave a GPU in service, besides an application's own (13, 31, 43, 45, "
                             "68, 109), as numbers separated by commas; 'all': no Xid error takes a GPU out of "
                             "service (default: any other does, $EMBER_IGNORE_XIDS)")
    sandboxing = parser.add_mutually_exclusive_group()
    sandboxing.add_argument("--insecure-no-sandbox", dest="sandbox", action="store_const", const="off",
                            default="required", help="run replicas without a sandbox: they see the whole node")
    sandboxing.add_argument("--sandbox-if-possible", dest="sandbox", action="store_const", const="if-possible",
                            help="sandbox replicas where the kernel allows it, else run them unsandboxed with a "
                                 "warning (`ember dev`); by default the agent refuses to start without sandboxes")
    args = parser.parse_args()
    _logging.configure("agent", args.log_format)
    try:
        creds = read_file(args.nats_creds) if args.nats_creds else None
    except CredentialsError as exc:
        parser.error(str(exc))
    if creds is None and not args.insecure_no_auth:
        parser.error(f"no NATS credentials: give --nats-creds (or ${CREDS_FILE_ENV}), the node's file from `python -m "
                     "ember_platform.natsauth node-creds DIR NODE_ID OUT`; --insecure-no-auth connects without")
    if creds is None:
        logging.getLogger("ember.agent").warning(
            "INSECURE (--insecure-no-auth): connected to NATS without credentials")
    try:
        sandbox = Sandbox.for_node(args.sandbox, nats_url=args.nats, own_for_all=args.sandbox_network == "own",
                                   keep=Records.of(args.state_dir).held_paths())  # to adopt them
    except SandboxUnavailable as exc:
        parser.error(f"{exc}. Replicas run in bubblewrap sandboxes; to run them unsandboxed, where they can read "
                     "everything this agent can, pass --insecure-no-sandbox")
    agent = NodeAgent(args.nats, args.state_dir, args.node_id, args.inventory, creds, sandbox=sandbox,
                      stop_grace_s=args.stop_grace_s, warm_starts=args.warm_starts, ignore_xids=args.ignore_xids,
                      build_memory_mb=args.build_memory_mb)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await agent.run(stop)

    try:
        ember_loop.run(run())
    finally:
        if sandbox.network is not None:
            sandbox.network.close()  # the door smith; the sockets it made stay fenced


if __name__ == "__main__":
    main()
