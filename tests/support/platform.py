"""The embedded platform with what only tests do to it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from ember.dev.embedded import EmbeddedPlatform


class TestPlatform(EmbeddedPlatform):
    """The embedded platform, with what only tests do to it: more node agents, and a NATS restart."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    def restart_nats(self, timeout_s: float = 30.0) -> None:
        """Stop nats-server and start it again on the same port and store (JetStream state survives)."""
        port = int(self.nats_url.rsplit(":", 1)[1])
        proc = self._procs.pop("nats")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout_s)
        self._start_nats(timeout_s, port)

    def add_agent(self, node_id: str, inventory: Path | None = None) -> subprocess.Popen[bytes]:
        """Start one more node agent here (a declared ``inventory`` simulates that node's GPUs)."""
        cmd = [sys.executable, "-m", "ember_runtime", "--nats", self.nats_url, "--node-id", node_id,
               "--state-dir", str(self.state_dir / f"node-{node_id}")]
        return self._spawn(f"agent-{node_id}", cmd + (["--inventory", str(inventory)] if inventory else []))
