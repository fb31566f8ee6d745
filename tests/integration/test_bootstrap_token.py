"""An installation's first admin token: a control plane started without ``--bootstrap-token-file`` on a NATS whose
token bucket is empty prints one, once (two starting together print one between them; a restart prints none), and
that token works; a bootstrap file's token is ensured idempotently by every control plane that is given it."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.auth import bearer
from support.polling import wait_for

from ember._procs import die_with_parent
from ember.dev.embedded import NATS_CONFIG, nats_server_binary
from ember.wire.tokens import new_token

pytestmark = pytest.mark.integration
_LISTENING = re.compile(r"Listening for client connections on [^:]+:(\d+)")
_PRINTED = re.compile(r"ember_admin_[A-Za-z0-9_-]+")


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    """A bare nats-server with JetStream (a fresh, empty store)."""
    conf, log = tmp_path / "nats.conf", tmp_path / "nats.log"
    conf.write_text(NATS_CONFIG)
    proc = subprocess.Popen([nats_server_binary(), "-a", "127.0.0.1", "-p", "-1", "-js", "-sd", str(tmp_path / "js"),
                             "-c", str(conf), "-l", str(log)], stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with_parent)
    try:
        port = wait_for(lambda: log.exists() and (m := _LISTENING.search(log.read_text())) and m[1], timeout_s=30,
                        what="nats-server")
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


class ControlPlane:
    """One control plane process, its output kept in a file."""

    def __init__(self, tmp: Path, name: str, nats: str, *extra: str) -> None:
        self.out = tmp / f"{name}.out"
        url_file = tmp / f"{name}.url"
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "ember_platform", "--nats", nats, "--port", "0",
                                          "--url-file", str(url_file), *extra], stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        self.url = str(wait_for(lambda: url_file.exists() and url_file.read_text(), timeout_s=60, what=name))

    def printed(self) -> list[str]:
        return _PRINTED.findall(self.out.read_text())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _whoami(url: str, token: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/tokens/self", headers=bearer(token), timeout=30)


def test_the_first_start_prints_one_admin_token_once(tmp_path: Path, nats_url: str):
    first, second = ControlPlane(tmp_path, "a", nats_url), ControlPlane(tmp_path, "b", nats_url)
    try:
        printed = first.printed() + second.printed()
        assert len(printed) == 1, printed  # two control planes starting together: one token between them
        token = printed[0]
        for plane in (first, second):  # the other one sees it through the bucket's watch
            wait_for(lambda plane=plane: _whoami(plane.url, token).status_code == 200, timeout_s=10, what="token")
        assert _whoami(first.url, token).json()["scopes"] == ["admin"]
        first.stop()
        again = ControlPlane(tmp_path, "a2", nats_url)
        try:
            assert again.printed() == []  # never again
            assert _whoami(again.url, token).status_code == 200
        finally:
            again.stop()
    finally:
        first.stop()
        second.stop()


def test_a_bootstrap_file_is_ensured_by_every_control_plane(tmp_path: Path, nats_url: str):
    token_file = tmp_path / "token"
    token_file.write_text(new_token() + "\n")
    token_file.chmod(0o600)
    token = token_file.read_text().strip()
    planes = [ControlPlane(tmp_path, f"cp{i}", nats_url, "--bootstrap-token-file", str(token_file)) for i in range(2)]
    try:
        assert [p.printed() for p in planes] == [[], []]
        for plane in planes:
            assert _whoami(plane.url, token).json()["name"] == "bootstrap"
            assert token not in plane.out.read_text()
        planes[0].stop()
        planes[0] = ControlPlane(tmp_path, "cp0-again", nats_url, "--bootstrap-token-file", str(token_file))
        assert _whoami(planes[0].url, token).status_code == 200  # across restarts
        listed = httpx.get(f"{planes[0].url}/v1/tokens", headers=bearer(token), timeout=30).json()
        assert len(listed) == 1  # recorded once
    finally:
        for plane in planes:
            plane.stop()


def test_a_bootstrap_file_others_can_read_is_refused(tmp_path: Path):
    token_file = tmp_path / "token"
    token_file.write_text(new_token() + "\n")
    token_file.chmod(0o644)
    proc = subprocess.run([sys.executable, "-m", "ember_platform", "--bootstrap-token-file", str(token_file)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "chmod 600" in proc.stderr
    assert token_file.read_text().strip() not in proc.stderr
