"""What the agent's tests share: a real sandbox of this node (bwrap), or a skip where the kernel allows none."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ember_runtime.agent import sandbox
from ember_runtime.agent.sandbox import Sandbox


@pytest.fixture(scope="module")
def node_sandbox() -> Sandbox:
    try:
        return Sandbox.for_node("required")
    except sandbox.SandboxUnavailable as exc:
        pytest.skip(f"this kernel does not allow sandboxes: {exc}")


@pytest.fixture(scope="module")
def networked(node_sandbox: Sandbox) -> Iterator[Sandbox]:
    """The node's sandbox with a network namespace of its own per sandbox (pasta), or a skip where it has none."""
    found = node_sandbox.with_network("nats://127.0.0.1:4222")
    if not found.own_network:
        pytest.skip(f"no network of its own for a sandbox here: {found.network_why_not}")
    yield found
    assert found.network is not None
    found.network.close()
