"""Product code has no switch that only tests use: faults are injected from outside it (``support.faults`` wraps a
node agent's functions in its own process; a test app's own code crashes its replica), so a production build (the
wheel, the Docker image, both built from these packages alone) neither contains nor honours them."""

from __future__ import annotations

import re

from support.paths import REPO

PRODUCT = [REPO / "sdk" / "ember", REPO / "platform" / "ember_platform", REPO / "runtime" / "ember_runtime"]


def test_no_product_module_reads_a_test_only_variable() -> None:
    found = [f"{path.relative_to(REPO)}:{n}" for root in PRODUCT for path in sorted(root.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if "EMBER_TEST_" in line]
    assert found == []


def test_the_fault_injection_seam_ships_in_no_build() -> None:
    """The wheel's packages and the image's copied folders are the product's own; neither takes ``tests/``."""
    pyproject = (REPO / "pyproject.toml").read_text()
    wheel = re.search(r"^packages = \[(.*)\]$", pyproject, re.M)
    assert wheel is not None and "tests" not in wheel.group(1)
    copied = re.findall(r"^COPY (?!--from)(\S+)", (REPO / "Dockerfile").read_text(), re.M)
    assert copied and not any(c.startswith("tests") for c in copied)
    for root in PRODUCT:
        assert not any("support.faults" in p.read_text() for p in root.rglob("*.py"))
