"""Shared fixtures. Integration tests run against a real embedded platform (nats-server, control plane,
node agent, replica processes) started once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.paths import REPO


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """A test that failed waiting for a replica to be ready gets the stacks of the node's processes in its report
    (``support.stacks``)."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and "not ready after" in str(report.longrepr):
        from support import stacks

        report.sections.append(("stacks of the agents and replicas (py-spy)", stacks.dump()))
