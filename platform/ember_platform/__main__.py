"""``python -m ember_platform``: serve the control plane with uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
from pathlib import Path

import uvicorn

from ember_platform._app import create_app
from ember_platform._config import Settings


def main() -> None:
    parser = argparse.ArgumentParser(prog="ember_platform", description="Ember control plane")
    parser.add_argument("--nats", default=None, help="NATS URL (default: $EMBER_NATS_URL)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8700, help="0 picks a free port")
    parser.add_argument("--url-file", type=Path, help="write the served URL here once listening")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s platform %(levelname)s %(message)s")
    settings = Settings(**({"nats_url": args.nats} if args.nats else {}))

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    url = f"http://{args.host}:{sock.getsockname()[1]}"
    config = uvicorn.Config(create_app(settings), log_level="warning", access_log=False,
                            timeout_graceful_shutdown=10)
    server = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            logging.info("serving on %s", url)
            if args.url_file:
                tmp = args.url_file.with_suffix(".tmp")
                tmp.write_text(url)
                tmp.replace(args.url_file)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
