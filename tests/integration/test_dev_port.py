"""``ember dev --port`` and ``--grpc-port``: a port another program holds (another Ember still running, most often) is
named before anything starts, with how to choose another; a free one is where the control plane then listens."""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.streams import read_lines

pytestmark = pytest.mark.integration
EMBER = [sys.executable, "-m", "ember.cli"]


@pytest.fixture
def taken() -> Iterator[socket.socket]:
    """A real listening socket on a free port of 127.0.0.1, as another Ember's control plane would hold it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener


def test_a_taken_port_is_named_before_anything_starts(taken: socket.socket, tmp_path: Path) -> None:
    port = taken.getsockname()[1]
    state = tmp_path / "dev-state"
    done = subprocess.run([*EMBER, "dev", "--port", str(port), "--state-dir", str(state)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"ember dev: port {port} on 127.0.0.1 is in use (another Ember still running?); choose another with "
        f"--port, as in `ember dev --port {port + 1}` (--port 0: any free port)"]
    assert "Ember is running" not in done.stdout
    assert not (state / "logs").exists() and not (state / "nats-auth").exists()  # nothing was started


def test_a_taken_grpc_port_is_named_before_anything_starts(taken: socket.socket, tmp_path: Path) -> None:
    port = taken.getsockname()[1]
    state = tmp_path / "dev-state"
    done = subprocess.run([*EMBER, "dev", "--port", "0", "--grpc-port", str(port), "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"ember dev: gRPC port {port} on 127.0.0.1 is in use (another Ember still running?); choose another with "
        f"--grpc-port, as in `ember dev --grpc-port {port + 1}` (--grpc-port 0: any free port)"]
    assert not (state / "logs").exists() and not (state / "nats-auth").exists()  # nothing was started


def test_a_free_port_is_where_ember_dev_serves(taken: socket.socket, tmp_path: Path) -> None:
    port = taken.getsockname()[1]
    taken.close()  # the other program ends: the port is free again
    cmd = [*EMBER, "dev", "--port", str(port), "--grpc-port", "0", "--state-dir", str(tmp_path / "dev-state")]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as dev:
        lines: queue.Queue[str] = queue.Queue()
        reader = read_lines(dev.stdout, lines.put)
        try:
            said = ""
            while not said.startswith("Ember is running at "):
                said = lines.get(timeout=120)
                assert "in use" not in said, said
            assert said.startswith(f"Ember is running at http://127.0.0.1:{port} "), said
            said = lines.get(timeout=10)
            assert said.startswith("Open Inference Protocol over gRPC at 127.0.0.1:"), said
        finally:
            dev.send_signal(signal.SIGINT)
            code = dev.wait(timeout=90)
            reader.join(timeout=10)
    assert code == 0
