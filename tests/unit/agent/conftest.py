"""What the agent's tests share: a real sandbox of this node (bwrap), or a skip where the kernel allows none."""

from __future__ import annotations

import pytest

from ember_runtime.agent import sandbox
from ember_runtime.agent.sandbox import Sandbox


@pytest.fixture(scope="module")
def node_sandbox() -> Sandbox:
    try:
        return Sandbox.for_node("required")
    except sandbox.SandboxUnavailable as exc:
        pytest.skip(f"this kernel does not allow sandboxes: {exc}")
