"""The embedded platform with what only tests do to it."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from ember.dev.embedded import EmbeddedPlatform, secrets_key
from support.auth import authed_client
from support.faults import AgentFaults
from support.natsconn import remember

STOP_GRACE_S = 2.0  # what each replica of a test platform's agents is given to drain when the platform stops


class TestPlatform(EmbeddedPlatform):
    """The embedded platform, with what only tests do to it: more node agents and control planes, a NATS restart,
    and a control plane killed."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    def __init__(self, state_dir: Path, *, faults: AgentFaults | None = None, sandbox: bool = True,
                 warm_starts: int = 0, **kwargs: Any) -> None:
        """``faults``: what its node agents do wrong (see ``support.faults``); none unless asked. ``sandbox``: its own
        agent's replicas in sandboxes where this machine allows them (else unsandboxed, ``--insecure-no-sandbox``).
        ``warm_starts``: its agents' ``--warm-starts`` (none unless asked: each imports torch ahead, a second of
        CPU that the suite's other tests would wait for)."""
        super().__init__(state_dir, **kwargs)
        self.faults = faults
        self.sandbox = sandbox
        self.warm_starts = warm_starts
        self._commands: dict[str, list[str]] = {}

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        self._commands[name] = cmd
        if name == "agent" and not self.sandbox:
            cmd = [("--insecure-no-sandbox" if arg == "--sandbox-if-possible" else arg) for arg in cmd]
        if cmd[1:3] == ["-m", "ember_runtime"]:
            # A test's platform stops at its end with calls still running (a call a test left busy for 20 s): its
            # replicas are not waited for as a production node's are.
            cmd = [*cmd, "--stop-grace-s", str(STOP_GRACE_S), "--warm-starts", str(self.warm_starts)]
            if self.faults is not None:
                cmd = self.faults.command(cmd)
        return super()._spawn(name, cmd)

    def _start_nats(self, timeout_s: float, port: int = -1) -> None:
        super()._start_nats(timeout_s, port)
        remember(self.nats_url, self.nats_credentials)  # tests that talk to NATS act as the control plane

    def stop(self, grace_s: float = 5 * STOP_GRACE_S) -> None:
        """Stop as ``ember dev`` does, killing what has not stopped after five times the replicas' drain: a process
        that hangs in its shutdown is named on stderr, not waited for 30 s."""
        super().stop(grace_s)

    def restart_nats(self, timeout_s: float = 30.0) -> None:
        """Stop nats-server and start it again on the same port and store (JetStream state survives)."""
        port = int(self.nats_url.rsplit(":", 1)[1])
        proc = self._procs.pop("nats")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout_s)
        self._start_nats(timeout_s, port)

    def add_agent(self, node_id: str, inventory: Path | None = None, *,
                  sandbox: bool = True) -> subprocess.Popen[bytes]:
        """Start one more node agent here (a declared ``inventory`` simulates that node's GPUs); its replicas in
        sandboxes where this machine allows them, unless ``sandbox`` is false."""
        cmd = [sys.executable, "-m", "ember_runtime", "--nats", self.nats_url, "--node-id", node_id,
               "--state-dir", str(self.state_dir / f"node-{node_id}"),
               "--nats-creds", str(self.node_credentials(node_id)),
               "--sandbox-if-possible" if sandbox else "--insecure-no-sandbox"]
        return self._spawn(f"agent-{node_id}", cmd + (["--inventory", str(inventory)] if inventory else []))

    def add_control_plane(self, name: str, timeout_s: float = 60.0, *, port: int = 0,
                          flags: tuple[str, ...] = ()) -> str:
        """Start one more control plane on this NATS (a standby while the first holds the control lease), with
        ``flags``; its URL."""
        url_file = self.state_dir / f"{name}.url"
        url_file.unlink(missing_ok=True)
        proc = self._spawn(name, [sys.executable, "-m", "ember_platform", "--nats", self.nats_url,
                                  "--nats-auth-dir", str(self.auth_dir), "--host", self.host, "--port", str(port),
                                  "--url-file", str(url_file), "--bootstrap-token-file", str(self.state_dir / "token"),
                                  "--secrets-key-file", str(secrets_key(self.state_dir / "secrets.key")), *flags])
        return str(self._await(lambda: url_file.read_text() if url_file.exists() else None, proc, name, timeout_s))

    def kill(self, name: str) -> None:
        """SIGKILL one of the processes this platform started (``platform``, ``agent``, a name given above)."""
        proc = self._procs.pop(name)
        proc.kill()
        proc.wait()

    def pause(self, name: str) -> None:
        """SIGSTOP one of its processes: it holds its connections and leases, and does nothing (a stalled host)."""
        self._procs[name].send_signal(signal.SIGSTOP)

    def start_again(self, name: str) -> subprocess.Popen[bytes]:
        """Start one of its processes again (after ``kill``: a node agent, say) as it was started: same node and
        state dir."""
        return self._spawn(name, self._commands[name])

    def restart_platform(self, timeout_s: float = 60.0) -> None:
        """SIGKILL the control plane and start it again on the same port (its memory is gone)."""
        self.kill("platform")
        self.start_platform(timeout_s)

    def start_platform(self, timeout_s: float = 60.0) -> None:
        """Start the control plane again on the same port, after ``kill("platform")``."""
        self.http_port = int(self.url.rsplit(":", 1)[1])
        self._start_platform(timeout_s)
        self._wait_ready(timeout_s)


@contextlib.contextmanager
def with_virtual_gpus(folder: Path, node_id: str, inventory: str) -> Iterator[tuple[TestPlatform, httpx.Client]]:
    """A test platform in ``folder`` with one more node agent, ``node_id``, whose GPUs are the declared (virtual)
    inventory ``inventory`` (TOML), its replicas sandboxed; and an HTTP client holding the platform's token."""
    (folder / f"{node_id}.toml").write_text(inventory)
    with TestPlatform(folder / "state") as platform, authed_client(platform) as http:
        platform.add_agent(node_id, folder / f"{node_id}.toml")
        yield platform, http
