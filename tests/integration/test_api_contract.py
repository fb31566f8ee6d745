"""The API keeps its own contract: schemathesis, as an outside user runs it, with every check (``--checks all``:
the coverage, fuzzing and stateful phases, answers against their schemas, valid data accepted and invalid data
refused, undeclared methods, ``Allow``, missing headers, ignored auth) and Ember's error shape, finds nothing.

It runs the schemathesis command itself against a platform of its own serving examples/hello (the run sets
quotas, secrets and subject grants at random, which would change what other tests' platforms answer), with the
repository's schemathesis.toml (what no schema can state, and why), ``SUITE_EXAMPLES`` examples per operation
and a fixed seed, so every run sends the same requests. DELETE of apps and tokens is left out: the run would
delete the app it calls and revoke its own token. ``make fuzz`` is the same run with ten times the examples.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.contract_checks import error_shape_problem
from support.paths import REPO
from support.platform import TestPlatform

from ember._client import Transport
from ember._deploy import deploy

pytestmark = pytest.mark.integration
SUITE_EXAMPLES = int(os.environ.get("EMBER_CONTRACT_EXAMPLES", "3"))  # per operation; `make fuzz`: 30
SEED = 1
TESTS = Path(__file__).resolve().parents[1]


def schemathesis_command(url: str, max_examples: int, seed: int = SEED) -> list[str]:
    """``schemathesis run`` with every check against ``url`` (its token in $EMBER_TOKEN's header, added by the
    caller): what this test and ``make fuzz`` run."""
    return [str(Path(sys.executable).with_name("schemathesis")), "run", f"{url}/openapi.json", "--checks", "all",
            "--max-examples", str(max_examples), "--seed", str(seed), "--generation-database", "none",
            "--exclude-operation-id-regex", r"^delete /v1/(apps|tokens)/", "--no-color", "--max-failures", "20"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestPlatform]:
    with TestPlatform(tmp_path_factory.mktemp("ember-contract")) as running:
        transport = Transport(running.url, token=running.token)
        try:
            deploy(REPO / "examples" / "hello" / "hello.py", transport=transport, timeout_s=120)
            # valid scale requests are sent too (up to 1,000 replicas): a quota keeps the machine's share bounded
            capped = transport.request("PUT", "/v1/quotas/contract-cap", json={"apps": "*", "max_replicas": 8})
            assert capped.status_code == 200, capped.text
        finally:
            transport.close()
        yield running


@pytest.mark.timeout(480)  # schemathesis on 2 cores under the full suite: 155-173 s, once over 180 (2026-12-06)
def test_schemathesis_with_every_check_finds_nothing(served: TestPlatform) -> None:
    command = [*schemathesis_command(served.url, SUITE_EXAMPLES), "-H", f"Authorization: Bearer {served.token}"]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "support.contract_checks",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    report = done.stdout[-12000:] + done.stderr[-4000:]
    assert done.returncode == 0, report
    assert "Coverage" in done.stdout and "Fuzzing" in done.stdout and "Stateful" in done.stdout, report
    selected, total = map(int, re.search(r"Selected: (\d+)/(\d+)", done.stdout).groups())  # type: ignore[union-attr]
    tested = int(re.search(r"Tested: (\d+)", done.stdout).group(1))  # type: ignore[union-attr]
    assert tested == selected == total - 2, report  # all but the two DELETEs left out


@pytest.mark.parametrize(("status", "kind", "body", "path", "wrong"), [
    (200, "text/plain", b"x", "/v1/apps", False),
    (404, "application/json", b'{"error": {"code": "not_found", "message": "m", "field": null, "type": null, '
                              b'"retry_after_s": null, "call_id": null}}', "/v1/apps/x", False),
    (404, "application/json", b'{"error": "no model x"}', "/v2/models/x", False),
    (404, "application/json", b'{"error": "no model x"}', "/v1/apps/x", True),
    (405, "text/plain", b"Method Not Allowed", "/v1/apps", True),
    (422, "application/json", b'{"detail": "x"}', "/v1/apps/x/scale", True),
    (400, "application/json", b"{", "/v1/apps", True),
])
def test_the_error_shape_check_tells_the_shapes_apart(status, kind, body, path, wrong) -> None:
    assert (error_shape_problem(status, kind, body, path) is not None) == wrong
