"""Shared fixtures. Integration tests run against a real embedded platform (nats-server, control plane,
node agent, replica processes) started once per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from support.paths import REPO


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


def pytest_markeval_namespace(config: pytest.Config) -> dict[str, object]:
    """Names a string condition of ``skipif`` may use, evaluated when its test runs: ``cuda()`` (torch imported
    then, not as each worker collects; ``support.lazy``)."""
    from support.lazy import cuda

    return {"cuda": cuda}


def _file_seconds() -> dict[str, float]:
    """``tests/slowest.txt``: seconds per test file (relative to tests/), as last measured."""
    seconds = {}
    for line in (REPO / "tests" / "slowest.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            took, path = line.split(maxsplit=1)
            seconds[path.strip()] = float(took)
    return seconds


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slowest files first (``tests/slowest.txt``; then other integration files, then the rest), each file's
    tests in their own order: ``make test``'s workers take files in this order (``--no-loadscope-reorder``), so
    the long ones start early and the short ones fill in at the end."""
    seconds = _file_seconds()
    tests = REPO / "tests"

    def weight(item: pytest.Item) -> float:
        path = item.path.relative_to(tests).as_posix() if item.path.is_relative_to(tests) else ""
        return seconds.get(path, 2.0 if path.startswith("integration/") else 0.0)

    items.sort(key=weight, reverse=True)  # stable: a file's tests stay together, in order
    if "torch" in sys.modules:  # every worker collects every file: a second of CPU each, on two cores
        raise pytest.UsageError("collecting the tests imported torch: use support.lazy's torch at module level "
                                "(and build torch values inside the tests, not in parametrize lists)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """A test that failed waiting for a replica to be ready gets the stacks of the node's processes in its report
    (``support.stacks``)."""
    outcome = yield
    report = outcome.get_result()
    if report.when in ("setup", "call") and report.failed and "not ready after" in str(report.longrepr):
        from support import stacks

        report.sections.append(("stacks of the agents and replicas (py-spy)", stacks.dump()))
