"""Shared fixtures. Integration tests run against a real embedded platform (nats-server, control plane,
node agent, replica processes) started once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.paths import REPO


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO
