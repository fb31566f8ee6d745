"""A three-server NATS cluster with JetStream on loopback, and Ember's processes connected to all three.

Each server gets its own store and log; routes join them into one cluster (``ember-test``). Ports are taken
from the kernel (bound to port 0, then released) just before the servers start, since routes name them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from ember._procs import die_with_parent
from ember.dev.embedded import NATS_CONFIG, nats_server_binary
from ember.wire.natscreds import write_file
from ember_platform.natsauth import keys as natsauth
from support.natsconn import connect, remember


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class NatsCluster:
    """Three ``nats-server`` processes with JetStream, routed together; ``url`` lists all three (``size=1``: one
    server alone, with the same auth)."""

    def __init__(self, root: Path, size: int = 3) -> None:
        self.root = root
        self.size = size
        self.ports: list[int] = []
        self.route_ports: list[int] = []
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.processes: list[subprocess.Popen[bytes]] = []  # Ember's own, started by ``spawn``
        self.auth_dir = root / "auth"  # the NATS auth keys: the servers admit no anonymous client
        self.keys = natsauth.init(self.auth_dir)

    @property
    def url(self) -> str:
        return ",".join(f"nats://127.0.0.1:{p}" for i, p in enumerate(self.ports) if i in self.procs)

    def start(self, timeout_s: float = 60.0) -> NatsCluster:
        ports = _free_ports(2 * self.size)
        self.ports, self.route_ports = ports[:self.size], ports[self.size:]
        for i in range(self.size):
            self.root.joinpath(f"n{i}").mkdir(parents=True, exist_ok=True)
            (self.root / f"n{i}" / "nats.conf").write_text(NATS_CONFIG + self.keys.server_config())
            self.restart(i)
        remember(self.url, self.keys.platform_credentials())
        asyncio.run(self._await_jetstream(timeout_s))
        return self

    def restart(self, index: int) -> None:
        """Start server ``index`` (again, after ``kill``: same port, same store), as its supervisor would."""
        here = self.root / f"n{index}"
        routes = ",".join(f"nats-route://127.0.0.1:{p}" for p in self.route_ports)
        cluster = ["--cluster_name", "ember-test", "--cluster", f"nats://127.0.0.1:{self.route_ports[index]}",
                   "--routes", routes] if self.size > 1 else []  # one server alone: no cluster to elect in
        log = (here / "nats.log").open("ab")
        self.procs[index] = subprocess.Popen(
            [nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.ports[index]), "-n", f"n{index}", "-js",
             "-sd", str(here / "store"), *cluster, "-c", str(here / "nats.conf")],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        log.close()

    async def _await_jetstream(self, timeout_s: float) -> None:
        """Until the cluster has elected its JetStream meta leader and can create a replicated stream."""
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(Exception):
                nc = await connect(self.url, connect_timeout=2, max_reconnect_attempts=1)
                try:
                    info = await nc.jetstream().account_info()
                    if info is not None:
                        return
                finally:
                    await nc.close()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the NATS cluster under {self.root} did not elect a JetStream leader")
            await asyncio.sleep(0.2)

    def kill(self, index: int) -> None:
        """SIGKILL one server: the cluster keeps a quorum of two."""
        proc = self.procs.pop(index)
        proc.kill()
        proc.wait()

    def spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """One of Ember's processes, connected to this cluster, its output in ``<root>/<name>.log``. A control
        plane is given the auth keys, and a node agent credentials of its own (node ``--node-id``, else ``name``)."""
        if cmd[:2] == ["-m", "ember_platform"]:
            cmd = [*cmd, "--nats-auth-dir", str(self.auth_dir)]
        elif cmd[:2] == ["-m", "ember_runtime"]:
            node_id = cmd[cmd.index("--node-id") + 1] if "--node-id" in cmd else name
            creds = write_file(self.root / "creds" / f"{node_id}.creds", self.keys.node_credentials(node_id))
            cmd = [*cmd, "--nats-creds", str(creds)] + ([] if "--node-id" in cmd else ["--node-id", node_id])
        log = (self.root / f"{name}.log").open("ab")
        proc = subprocess.Popen([sys.executable, *cmd], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                                start_new_session=True, preexec_fn=die_with_parent)
        log.close()
        self.processes.append(proc)
        return proc

    def stop(self) -> None:
        for proc in [*self.processes, *self.procs.values()]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*self.processes, *self.procs.values()]:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
