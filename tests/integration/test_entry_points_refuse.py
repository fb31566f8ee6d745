"""Safe by default: the production entry points refuse to start without NATS credentials, saying what to give and
which flag runs without them (the Docker image's command is ``python -m ember_platform``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration
_ENV = {k: v for k, v in os.environ.items()
        if k not in ("EMBER_NATS_AUTH_DIR", "EMBER_NATS_CREDS_FILE", "EMBER_BOOTSTRAP_TOKEN_FILE")}


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=60, env=_ENV,
                          stdin=subprocess.DEVNULL)


def test_a_control_plane_without_nats_credentials_refuses_to_start():
    proc = _run("ember_platform", "--host", "0.0.0.0", "--port", "0")  # as the Docker image's command
    assert proc.returncode == 2, proc.stderr
    assert "no NATS credentials" in proc.stderr and "--nats-auth-dir" in proc.stderr
    assert "--insecure-no-nats-auth" in proc.stderr


def test_a_node_agent_without_nats_credentials_refuses_to_start(tmp_path):
    proc = _run("ember_runtime", "--insecure-no-sandbox", "--state-dir", str(tmp_path), "--nats",
                "nats://127.0.0.1:1")
    assert proc.returncode == 2, proc.stderr
    assert "no NATS credentials" in proc.stderr and "--nats-creds" in proc.stderr
    assert "--insecure-no-auth" in proc.stderr
