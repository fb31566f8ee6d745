from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from support.auth import authed_client
from support.paths import REPO
from support.platform import TestPlatform

from ember._client import Transport
from ember._deploy import deploy
from ember._volume import put_volume
from ember.dev.embedded import EmbeddedPlatform
from ember.wire import AppView


@pytest.fixture(scope="session")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestPlatform]:
    """Ember on this machine: a real nats-server with JetStream, the control plane and one node agent."""
    state = tmp_path_factory.mktemp("ember")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("EMBER_ACK_WAIT_S", "3")  # short, so that redelivery after a crash is quick to test
        env.setenv("EMBER_KEEP_PREVIOUS_S", "0")  # a replaced version stops after its drain (test_keep_previous:
        #                                          the platforms that keep it warm)
        # every test platform: every sandbox in a network of its own (the default); this one serves gRPC too
        with TestPlatform(state, grpc_port=0) as running:
            yield running


@pytest.fixture(scope="session")
def transport(platform: EmbeddedPlatform) -> Iterator[Transport]:
    t = Transport(platform.url, token=platform.token)
    yield t
    t.close()


@pytest.fixture
def ember_url(platform: EmbeddedPlatform, monkeypatch: pytest.MonkeyPatch) -> str:
    """Points the SDK's default transport (EMBER_URL, EMBER_TOKEN) at the session platform."""
    monkeypatch.setenv("EMBER_URL", platform.url)
    monkeypatch.setenv("EMBER_TOKEN", platform.token)
    return platform.url


@pytest.fixture(scope="session")
def http(platform: EmbeddedPlatform) -> Iterator[httpx.Client]:
    with authed_client(platform) as http_client:
        yield http_client


class Deployer:
    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.cache: dict[tuple[str, str | None], AppView] = {}

    def __call__(self, path: Path, app_name: str | None = None) -> AppView:
        key = (str(path), app_name)
        if key not in self.cache:
            if path == REPO / "examples" / "digits" / "classifier.py":  # its weights are a volume: put it first
                put_volume("digits-weights", [path.parent / "weights.pt"], transport=self.transport)
            self.cache[key] = deploy(path, app_name=app_name, transport=self.transport, timeout_s=120)
        return self.cache[key]


@pytest.fixture(scope="session")
def deployed(transport: Transport) -> Deployer:
    """Deploys an app once per session (and waits for its replicas)."""
    return Deployer(transport)


@pytest.fixture(scope="session")
def hello(deployed: Deployer) -> AppView:
    return deployed(REPO / "examples" / "hello" / "hello.py")


@pytest.fixture(scope="session")
def probe(deployed: Deployer) -> AppView:
    return deployed(REPO / "tests" / "apps" / "probe" / "probe.py")


def _run_cli(*args: str, url: str, token: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "ember.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "EMBER_URL": url, "EMBER_TOKEN": token})
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="session")
def ember_cli(platform: EmbeddedPlatform) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Runs the `ember` CLI in a subprocess against ``url`` with ``token`` (the session platform's admin token unless
    given); asserts success unless ``check=False``."""
    def run(*args: str, url: str, token: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run_cli(*args, url=url, token=platform.token if token is None else token, check=check)

    return run


@pytest.fixture
def collect_refused_sockets() -> Iterator[None]:
    """After each test of a module that opens refused NATS connections: collect the sockets nats-py leaves from
    them (an unclosed-transport warning each) under that module's warning filter, and at a known moment: left to
    the collector, one ran mid-import in a later test and broke pytest's own warning hook."""
    yield
    gc.collect()
