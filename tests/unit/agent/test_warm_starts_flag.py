"""The node agent's ``--warm-starts`` (and ``EMBER_WARM_STARTS``): a whole number from 0 to 64, anything else refused
with argparse's error naming the option, before the agent connects anywhere."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("value", ["-1", "65", "two", "1.5", "", "1e3", "9" * 40])
def test_a_value_that_is_not_a_count_is_refused(value, tmp_path):
    done = subprocess.run([sys.executable, "-m", "ember_runtime", "--state-dir", str(tmp_path), "--warm-starts", value,
                           "--insecure-no-auth", "--insecure-no-sandbox", "--nats", "nats://127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--warm-starts" in done.stderr, done.stderr


def test_the_environment_variable_is_checked_too(tmp_path):
    done = subprocess.run([sys.executable, "-m", "ember_runtime", "--state-dir", str(tmp_path), "--insecure-no-auth",
                           "--insecure-no-sandbox", "--nats", "nats://127.0.0.1:1"], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, "EMBER_WARM_STARTS": "lots"})
    assert done.returncode == 2 and "--warm-starts" in done.stderr, done.stderr
