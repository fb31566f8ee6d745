"""Where things are: the repository, its examples, and the tests' own apps."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
DIGITS = EXAMPLES / "digits"
TEST_APPS = REPO / "tests" / "apps"
