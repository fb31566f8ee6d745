"""``python -m ember_platform``: serve the control plane with uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import socket
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import uvicorn

from ember import _gc, _logging
from ember import _loop as ember_loop
from ember import _tracing as tracing
from ember_platform.auth.bootstrap import first_token_banner, loopback_only, read_token_file
from ember_platform.config import Settings
from ember_platform.gateway.asgi import create_app
from ember_platform.secrets.key import SecretsKeyError, read_key

# An idle kept-alive connection is closed after this long: more than a client's or a load balancer's own idle
# limit (httpx: 5 s, uvicorn's default too; AWS ALB: 60 s), so that the client always closes first. Otherwise a
# request sent as the server closes meets "Server disconnected" (a POST is not retried).
KEEP_ALIVE_S = 75
GC_THRESHOLDS = (20_000, 50, 100)  # the cyclic collector's, for the control plane once it serves (``settle_gc``)


def main() -> None:
    parser = argparse.ArgumentParser(prog="ember_platform", description="Ember control plane")
    parser.add_argument("--nats", default=None, help="NATS URL (default: $EMBER_NATS_URL)")
    parser.add_argument("--nats-auth-dir", default=None,
                        help="NATS auth keys, from `python -m ember_platform.natsauth init` ($EMBER_NATS_AUTH_DIR)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8700, help="0 picks a free port")
    parser.add_argument("--url-file", type=Path, help="write the served URL here once listening")
    parser.add_argument("--grpc-port", type=int, default=None,
                        help="serve the Open Inference Protocol over gRPC (Triton's and KServe's "
                             "inference.GRPCInferenceService) on this port too; 0 picks a free port (off unless given)")
    parser.add_argument("--grpc-url-file", type=Path,
                        help="write the gRPC address (host:port) here once listening, before --url-file is written")
    parser.add_argument("--reuse-port", action="store_true",
                        help="bind with SO_REUSEPORT, so that several control planes on this host serve one --port "
                             "(the kernel spreads the connections among them)")
    parser.add_argument("--bootstrap-token-file", type=Path, default=None,
                        help="a file holding an admin token (mode 0600; written first if missing): its record is "
                             "ensured at start ($EMBER_BOOTSTRAP_TOKEN_FILE)")
    parser.add_argument("--secrets-key-file", type=Path, default=None,
                        help="the key secrets are encrypted under (a Fernet key, mode 0600); without one, secrets "
                             "are off ($EMBER_SECRETS_KEY_FILE)")
    parser.add_argument("--log-format", choices=_logging.FORMATS, default=_logging.default_format(),
                        help=f"text lines, or one JSON object per line (${_logging.FORMAT_ENV})")
    parser.add_argument("--insecure-no-auth", action="store_true",
                        help="check no tokens and run without NATS credentials: every request may do everything "
                             "(refused unless --host is loopback)")
    parser.add_argument("--insecure-no-nats-auth", action="store_true",
                        help="run without NATS credentials (no --nats-auth-dir): nats-server then admits any client, "
                             "which may read and write every app's calls, secrets' requests and bundles")
    parser.add_argument("--replica-credentials-ttl", type=float, default=None, metavar="SECONDS",
                        help="how long a replica's NATS credentials hold after each connect; replicas renew at half "
                             "($EMBER_REPLICA_CREDENTIALS_TTL_S, default 3600; give node agents the same variable)")
    args = parser.parse_args()
    if args.replica_credentials_ttl is not None and not 1 <= args.replica_credentials_ttl <= 30 * 86400:
        parser.error("--replica-credentials-ttl is a number of seconds from 1 to 30 days")
    _check_auth(parser, args)
    _logging.configure("platform", args.log_format)
    _warn_insecure(args)
    tracing.setup("ember-platform")  # before the app is built: its hot path is chosen traced or not
    overrides = {"nats_url": args.nats, "nats_auth_dir": args.nats_auth_dir,
                 "replica_credentials_ttl_s": args.replica_credentials_ttl}
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None}, **_auth_settings(args))

    port = args.port
    try:  # before anything starts: a port another process holds ends this start at once, not after NATS
        listening = _listening_socket(args.host, port, reuse_port=args.reuse_port)
        if args.grpc_port:
            port = args.grpc_port
            _listening_socket(args.host, port, reuse_port=args.reuse_port).close()  # grpc binds it again, itself
    except OSError as exc:
        hint = "" if args.reuse_port else " (several control planes share one port with --reuse-port, each of them)"
        parser.exit(1, f"ember_platform: cannot listen on {args.host}:{port}: {exc.strerror or exc}{hint}\n")
    config = uvicorn.Config(create_app(settings, on_first_token=_announce, beside=_grpc(args)), host=args.host,
                            port=args.port,
                            log_level="warning",
                            access_log=False, timeout_graceful_shutdown=10,
                            timeout_keep_alive=KEEP_ALIVE_S,
                            proxy_headers=False)  # nothing reads the client's address; saves a layer per call
    server = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[listening]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            settle_gc()
            port = server.servers[0].sockets[0].getsockname()[1]
            url = f"http://{args.host}:{port}"
            logging.info("serving on %s", url)
            if args.url_file:
                tmp = args.url_file.with_suffix(".tmp")
                tmp.write_text(url)
                tmp.replace(args.url_file)
        await task

    try:
        ember_loop.run(serve())
    finally:
        tracing.shutdown()  # the last spans, flushed


def _grpc(args: argparse.Namespace) -> Callable[[Any], AbstractAsyncContextManager[object]] | None:
    """The gRPC server of ``--grpc-port``, None without it. Its module is imported only then: grpc costs a control
    plane's start a fifth more imports (60 ms), and most control planes (the test suite's) serve no gRPC."""
    if args.grpc_port is None:
        return None
    oip_grpc = importlib.import_module("ember_platform.gateway.oip_grpc")
    serving: Callable[[Any], AbstractAsyncContextManager[object]] = oip_grpc.serving(
        args.host, args.grpc_port, reuse_port=args.reuse_port, url_file=args.grpc_url_file)
    return serving


def settle_gc() -> None:
    """Once the control plane serves: what its start made is frozen (``ember._gc.settle``), and the youngest
    generation is collected every ``GC_THRESHOLDS[0]`` allocations instead of 700. A call allocates a few hundred
    objects, almost none in cycles; at Python's defaults the collector took about a tenth of the gateway's CPU at
    concurrency 64 (bench/RESULTS.md, "Speed per call")."""
    _gc.settle(GC_THRESHOLDS)


def _listening_socket(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    """The control plane's address, bound; with ``reuse_port``, shared with the other processes that bind it with
    SO_REUSEPORT (the kernel spreads the connections among them). ``IPPROTO_TCP`` so that asyncio turns Nagle's
    algorithm off on the connections it accepts (a socket of protocol 0 would cost a kept-alive call 40 ms)."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def _check_auth(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit 2 with a clear message for a setting that would expose the platform or cannot work."""
    if args.insecure_no_auth and not loopback_only(args.host):
        parser.error(f"--insecure-no-auth lets anyone who reaches the port run code on every node: it is refused on "
                     f"--host {args.host}; use a loopback address (127.0.0.1, ::1), or tokens")
    path = args.bootstrap_token_file or (Path(os.environ["EMBER_BOOTSTRAP_TOKEN_FILE"])
                                         if os.environ.get("EMBER_BOOTSTRAP_TOKEN_FILE") else None)
    if path is not None:
        try:
            read_token_file(path)
        except (OSError, ValueError) as exc:
            parser.error(f"--bootstrap-token-file: {exc}")
    key = args.secrets_key_file or (Path(os.environ["EMBER_SECRETS_KEY_FILE"])
                                    if os.environ.get("EMBER_SECRETS_KEY_FILE") else None)
    if key is not None:
        try:
            read_key(key)
        except SecretsKeyError as exc:
            parser.error(f"--secrets-key-file: {exc}")
    if not (args.nats_auth_dir or os.environ.get("EMBER_NATS_AUTH_DIR")) and not insecure_nats(args):
        parser.error("no NATS credentials: give --nats-auth-dir (a folder made by `python -m "
                     "ember_platform.natsauth init DIR`, or $EMBER_NATS_AUTH_DIR), so that nats-server admits each "
                     "node and replica with its own permissions; --insecure-no-nats-auth runs without, where any "
                     "NATS client may do anything")


def insecure_nats(args: argparse.Namespace) -> bool:
    """Whether this control plane was told to run without NATS credentials (either insecure flag)."""
    return bool(args.insecure_no_auth or args.insecure_no_nats_auth)


def _warn_insecure(args: argparse.Namespace) -> None:
    """Say, in the log, what an insecure flag leaves open (``ember status`` shows it too)."""
    if args.insecure_no_auth:
        logging.warning("INSECURE (--insecure-no-auth): no token is checked and NATS admits clients without "
                        "credentials; for one machine only")
    elif not (args.nats_auth_dir or os.environ.get("EMBER_NATS_AUTH_DIR")):
        logging.warning("INSECURE (--insecure-no-nats-auth): NATS admits clients without credentials, and any of "
                        "them may read and write every app's calls")


def _auth_settings(args: argparse.Namespace) -> dict[str, Any]:
    settings: dict[str, Any] = {"auth": not args.insecure_no_auth}
    if args.bootstrap_token_file is not None:
        settings["bootstrap_token_file"] = str(args.bootstrap_token_file)
    if args.secrets_key_file is not None:
        settings["secrets_key_file"] = str(args.secrets_key_file)
    return settings


def _announce(token: str) -> None:
    print(first_token_banner(token), flush=True)


if __name__ == "__main__":
    main()
