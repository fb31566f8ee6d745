"""``python -m ember_platform``: serve the control plane with uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

import uvicorn

from ember import _loop as ember_loop
from ember_platform.config import Settings
from ember_platform.gateway.asgi import create_app


def main() -> None:
    parser = argparse.ArgumentParser(prog="ember_platform", description="Ember control plane")
    parser.add_argument("--nats", default=None, help="NATS URL (default: $EMBER_NATS_URL)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8700, help="0 picks a free port")
    parser.add_argument("--url-file", type=Path, help="write the served URL here once listening")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s platform %(levelname)s %(message)s")
    settings = Settings(**({"nats_url": args.nats} if args.nats else {}))

    # uvicorn binds the port itself: sockets handed to it skip TCP_NODELAY, costing 40 ms per kept-alive call.
    config = uvicorn.Config(create_app(settings), host=args.host, port=args.port, log_level="warning",
                            access_log=False, timeout_graceful_shutdown=10,
                            proxy_headers=False)  # nothing reads the client's address; saves a layer per call
    server = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            port = server.servers[0].sockets[0].getsockname()[1]
            url = f"http://{args.host}:{port}"
            logging.info("serving on %s", url)
            if args.url_file:
                tmp = args.url_file.with_suffix(".tmp")
                tmp.write_text(url)
                tmp.replace(args.url_file)
        await task

    ember_loop.run(serve())


if __name__ == "__main__":
    main()
